"""OpenAI's legacy Completions API (``POST /openai/v1/completions``) on Chat Completions'
pipeline: the body is validated by ``wire/completions.py``, made into the chat request it
means (``translate/completions.py``), translated by chat's translator, and the chat answer
reshaped into ``text_completion`` objects. Errors, billing, limits and routing are chat's; the
ledger names the endpoint ``completions``."""

from __future__ import annotations

from typing import Any

from ezat_compat.dialects import (
    Answer,
    EventTranslator,
    Headers,
    Parsed,
    ReplyIds,
    Resolve,
    model_then_body,
    upstream_message,
)
from ezat_compat.dialects.openai_chat import ChunkTranslator, Context, OpenAIChat
from ezat_compat.jsonfast import encode_json
from ezat_compat.jsonfast import sse_data as encode_chunk
from ezat_compat.translate.completions import (
    ID_PREFIX,
    PROMPT,
    chat_to_completion,
    chunk_to_completion,
    completion_to_chat,
)
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.translate.response import anthropic_to_openai, usage_from_anthropic
from ezat_compat.translate.stream import DONE, StreamTranslator
from ezat_compat.wire.completions import load_completion_request
from ezat_compat.wire.openai import MODEL_NAME_MAX


class TextChunkTranslator(ChunkTranslator):
    """Anthropic events -> ``text_completion`` chunks (chat's chunks, reshaped), then
    ``[DONE]``; the usage chunk (``choices: []``) first when ``include_usage`` was asked."""

    __slots__ = ()

    def feed(self, event: str, data: str) -> bytes:
        out = b""
        for chunk in self.translate(event, data):
            text_chunk = chunk_to_completion(chunk)
            if text_chunk is not None:
                out += encode_chunk(text_chunk)
        return out

    def end(self) -> bytes:
        if self.source.include_usage:
            usage = chunk_to_completion(self.source.usage_chunk())
            return encode_chunk(usage) + DONE if usage is not None else DONE
        return DONE


class OpenAICompletions(OpenAIChat):
    """``POST /openai/v1/completions``: chat's dialect but for the request's and the answer's shapes."""

    endpoint = "completions"

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        """As chat: an unknown or forbidden model answers 404 / 403 before the body is judged."""
        model, req = model_then_body(body, resolve, load_completion_request, MODEL_NAME_MAX)
        auto_cache = (headers.get("x-ezat-cache") or "").strip(" \t").lower() != "off"
        chat = completion_to_chat(req)
        translation = openai_to_anthropic(chat, model, auto_cache=auto_cache)
        # An upstream 400 about the one message names the prompt.
        translation.source_map = {key: PROMPT for key in translation.source_map}
        return Parsed(
            model=model,
            model_name=req["model"],
            body=translation.body,
            stream=translation.stream,
            max_tokens=translation.body["max_tokens"],
            session=headers.get("x-ezat-session") or translation.session,
            context=Context(chat, translation),
        )

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        message = upstream_message(data)
        completion = anthropic_to_openai(
            message, completion_id=ID_PREFIX + ids.request_id, created=ids.created, model=parsed.model_name
        )
        return Answer(encode_json(chat_to_completion(completion)), usage_from_anthropic(message.get("usage")))

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator:
        translation = parsed.context.translation
        return TextChunkTranslator(
            StreamTranslator(
                completion_id=ID_PREFIX + ids.request_id,
                created=ids.created,
                model=parsed.model_name,
                include_usage=translation.include_usage,
            ),
            None,
        )
