"""The openai and anthropic SDKs' types that tests check our output against, imported and built
once, at their first use: importing an SDK takes seconds, which collecting a test module (in each
of the suite's processes) would otherwise pay; a ``TypeAdapter`` of a big union takes tens of
milliseconds, which every parametrized row would otherwise pay again."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from tests.support.heap import freeze_what_is_loaded


@functools.cache
def _openai() -> SimpleNamespace:
    import openai.types
    import openai.types.chat
    import openai.types.responses
    from pydantic import TypeAdapter

    types = SimpleNamespace(
        completion=openai.types.Completion,
        chat_completion=openai.types.chat.ChatCompletion,
        chat_chunk=openai.types.chat.ChatCompletionChunk,
        response=openai.types.responses.Response,
        response_events=TypeAdapter(openai.types.responses.ResponseStreamEvent),
    )
    freeze_what_is_loaded()  # the SDK's types and validators: for the process's life
    return types


@functools.cache
def _anthropic_events() -> Any:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(RawMessageStreamEvent)
    freeze_what_is_loaded()  # the SDK's types and validators: for the process's life
    return adapter


def chat_completion(body: Any) -> Any:
    """``body`` parsed as the openai SDK's ``ChatCompletion`` (raises when it isn't one)."""
    return _openai().chat_completion.model_validate(body)


def chat_chunk(chunk: Any) -> Any:
    """``chunk`` parsed as the openai SDK's ``ChatCompletionChunk``."""
    return _openai().chat_chunk.model_validate(chunk)


def chat_stream_state() -> Any:
    """A new accumulator of chunks, the openai SDK's ``ChatCompletionStreamState``."""
    from openai.lib.streaming.chat import ChatCompletionStreamState

    return ChatCompletionStreamState()


def text_completion(body: Any) -> Any:
    """``body`` parsed as the openai SDK's ``Completion`` (the legacy Completions API)."""
    return _openai().completion.model_validate(body)


def response(body: Any) -> Any:
    """``body`` parsed as the openai SDK's ``Response`` (the Responses API)."""
    return _openai().response.model_validate(body)


def response_event(payload: Any) -> Any:
    """``payload`` parsed as one of the openai SDK's ``ResponseStreamEvent`` types."""
    return _openai().response_events.validate_python(payload)


def anthropic_event(data: Any) -> Any:
    """``data`` parsed as one of the anthropic SDK's ``RawMessageStreamEvent`` types."""
    return _anthropic_events().validate_python(data)
