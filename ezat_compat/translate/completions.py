"""The legacy Completions API over Chat Completions' translation (docs/clients.md, "Routes";
openai-python ``types/completion.py``, ``completion_choice.py``).

- ``completion_to_chat(req)``: a validated completions request -> the Chat Completions request
  it means (the prompt as one user message; ``max_tokens`` defaults to 16, as OpenAI's).
- ``chat_to_completion(completion)``: a ``chat.completion`` -> a ``text_completion``.
- ``chunk_to_completion(chunk)``: a ``chat.completion.chunk`` -> a ``text_completion`` chunk
  (None for a chunk with nothing to say: the role chunk).

Pure: the chat translators (``translate/request.py``, ``response.py``, ``stream.py``) do the
work; these only reshape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy API
OBJECT = "text_completion"
ID_PREFIX = "cmpl-"
# The request fields that mean the same on both APIs (the others are refused or ignored).
SHARED_FIELDS = ("model", "stream", "stream_options", "temperature", "top_p", "stop", "n", "logit_bias")
PROMPT = "prompt"  # where an upstream 400 about the one message points


def prompt_text(value: Any) -> str | None:
    """The one prompt ``value`` holds (a string, or a list of one string); None otherwise."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else None


def completion_to_chat(req: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request of a validated completions request."""
    chat = {name: req[name] for name in SHARED_FIELDS if name in req}
    chat["messages"] = [{"role": "user", "content": prompt_text(req["prompt"])}]
    max_tokens = req.get("max_tokens")
    chat["max_tokens"] = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    return chat


def _choice(text: str, finish_reason: Any) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


def chat_to_completion(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` (one choice, no tool calls) as a ``text_completion``."""
    choice = completion["choices"][0]
    return {
        "id": completion["id"],
        "object": OBJECT,
        "created": completion["created"],
        "model": completion["model"],
        "choices": [_choice(choice["message"].get("content") or "", choice["finish_reason"])],
        "usage": completion["usage"],
    }


def chunk_to_completion(chunk: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``chat.completion.chunk`` as a ``text_completion`` chunk: text, the finish reason, or
    the usage (``choices: []``); None for the role chunk, which has none of them."""
    out = dict(chunk, object=OBJECT)
    choices = chunk["choices"]
    if choices:
        choice = choices[0]
        text = choice["delta"].get("content") or ""
        if not text and choice["finish_reason"] is None:
            return None
        out["choices"] = [_choice(text, choice["finish_reason"])]
    return out
