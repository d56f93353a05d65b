"""The legacy Completions API (``POST /openai/v1/completions``) over chat's translation: one row
per rule of the route table in docs/clients.md. Requests go through the dialect's ``parse`` (schema, then
chat's translator); answers are validated with the openai SDK's ``Completion`` type."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ezat_compat.config import parse_config
from ezat_compat.dialects import ReplyIds
from ezat_compat.dialects.openai_completions import OpenAICompletions
from ezat_compat.domain import Model
from ezat_compat.errors import InvalidRequestError
from ezat_compat.translate.completions import chunk_to_completion, completion_to_chat
from tests.support import sdk_types
from tests.support.anthropic_types import validate_anthropic_request

DIALECT = OpenAICompletions()
IDS = ReplyIds(request_id="r1", created=1700000000)
BASE_MODEL = parse_config(
    {
        "models": [
            {
                "id": "anthropic/test",
                "aliases": ["test"],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "claude-sonnet-5-5"}],
            }
        ]
    }
).models[0]


def parse(extra: dict[str, Any], **model_changes: Any) -> Any:
    model = dataclasses.replace(BASE_MODEL, **model_changes)

    def resolve(name: Any) -> Model:
        return model

    return DIALECT.parse({"model": "test", "prompt": "Hi", **extra}, {"x-ezat-cache": "off"}, resolve)


def refused(extra: dict[str, Any]) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        parse(extra)
    assert caught.value.status == 400 and caught.value.openai_type == "invalid_request_error"
    return caught.value


# ---------------------------------------------------------------- the request


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({}, {"max_tokens": 16}, id="default-limit-16"),
        pytest.param({"prompt": ["Hi"], "max_tokens": 99}, {"max_tokens": 99}, id="array-of-one-prompt"),
        pytest.param({"stop": "END"}, {"stop_sequences": ["END"]}, id="stop-string"),
        pytest.param({"stop": ["A", "B"]}, {"stop_sequences": ["A", "B"]}, id="stop-list"),
        pytest.param({"temperature": 1.5}, {"temperature": 1}, id="temperature-capped-as-chat"),
        pytest.param({"top_p": 0.5}, {"top_p": 0.5}, id="top-p-as-chat"),
        pytest.param({"temperature": 0.2, "top_p": 0.5}, {"temperature": 0.2}, id="never-both"),
    ],
)
def test_the_prompt_is_one_user_message_of_a_chat_request(extra: dict[str, Any], expected: dict[str, Any]) -> None:
    parsed = parse(extra, sampling=True)
    body = parsed.body
    validate_anthropic_request({"model": "claude-sonnet-5-5", **body})
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert {k: body[k] for k in expected} == expected
    assert not parsed.stream and "system" not in body and "tools" not in body


@pytest.mark.parametrize(
    ("extra", "sent"),
    [
        pytest.param({"user": "u", "seed": 7}, {}, id="user-and-seed-ignored"),
        pytest.param({"frequency_penalty": 1, "presence_penalty": 1}, {}, id="penalties-ignored"),
        pytest.param({"n": 1, "best_of": 1, "echo": False, "suffix": "", "logprobs": None}, {}, id="harmless-values"),
        pytest.param({"logit_bias": {}}, {}, id="empty-logit-bias"),
        pytest.param({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}, id="stream"),
    ],
)
def test_tolerated_fields(extra: dict[str, Any], sent: dict[str, Any]) -> None:
    parsed = parse(extra)
    assert parsed.stream is bool(sent.get("stream"))
    assert not {"user", "seed", "frequency_penalty", "presence_penalty", "n", "best_of", "suffix"} & set(parsed.body)


def test_chat_request_keeps_only_the_shared_fields() -> None:
    req = {"model": "m", "prompt": ["Hi"], "suffix": None, "echo": False, "user": "u", "stop": "X", "stream": True}
    assert completion_to_chat(req) == {
        "model": "m",
        "stream": True,
        "stop": "X",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 16,
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param({"suffix": "tail"}, "suffix: text insertion is not supported; send the text before the "
                     "insertion point as the prompt", id="suffix"),
        pytest.param({"echo": True}, "echo: echoing the prompt is not supported", id="echo"),
        pytest.param({"logprobs": 1}, "logprobs: log probabilities are not available", id="logprobs"),
        pytest.param({"logprobs": 0}, "logprobs: log probabilities are not available", id="logprobs-zero"),
        pytest.param({"best_of": 2}, "best_of: only 1 completion per request is supported", id="best-of"),
        pytest.param({"n": 2}, "n: only 1 choice per request is supported", id="n-as-chat"),
        pytest.param({"logit_bias": {"50256": -100}}, "logit_bias: is not supported", id="logit-bias-as-chat"),
        pytest.param({"prompt": ["a", "b"]}, "prompt: send one prompt: a string, or an array of one string "
                     "(token ids are not supported)", id="two-prompts"),
        pytest.param({"prompt": [1, 2, 3]}, "prompt: send one prompt: a string, or an array of one string "
                     "(token ids are not supported)", id="token-ids"),
        pytest.param({"prompt": []}, "prompt: send one prompt: a string, or an array of one string "
                     "(token ids are not supported)", id="no-prompt-in-the-array"),
        pytest.param({"prompt": "  "}, "prompt: must not be empty", id="blank-prompt"),
        pytest.param({"prompt": None}, "prompt: Field may not be null.", id="null-prompt"),
        pytest.param({"max_tokens": 0}, "max_tokens: Must be greater than or equal to 1.", id="zero-limit"),
        pytest.param({"max_tokens": 10**9}, "max_tokens: must be at most 64000 for model test", id="over-the-model"),
        pytest.param({"temperature": 3}, "temperature: Must be greater than or equal to 0 and less than or equal "
                     "to 2.", id="temperature-range"),
        pytest.param({"stream": "yes"}, "stream: Not a valid boolean.", id="stream-not-a-boolean"),
    ],
)  # fmt: skip
def test_refused_fields_name_the_field(extra: dict[str, Any], message: str) -> None:
    err = refused(extra)
    assert err.message == message and err.param == message.split(":", 1)[0]


def test_a_missing_prompt_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        DIALECT.parse({"model": "test"}, {}, lambda name: BASE_MODEL)
    assert caught.value.message == "prompt: Missing data for required field."


# ---------------------------------------------------------------- the answer


def anthropic_message(text: str, stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 3},
    }


@pytest.mark.parametrize(
    ("text", "stop_reason", "finish_reason"),
    [
        pytest.param("Hello", "end_turn", "stop", id="end-turn"),
        pytest.param("Hel", "max_tokens", "length", id="max-tokens"),
        pytest.param("Hello", "stop_sequence", "stop", id="stop-sequence"),
        pytest.param("", "refusal", "content_filter", id="refusal"),
    ],
)
def test_a_reply_is_a_text_completion(text: str, stop_reason: str, finish_reason: str) -> None:
    answer = DIALECT.reply(parse({}), json.dumps(anthropic_message(text, stop_reason)).encode(), IDS)
    body = json.loads(answer.body)
    sdk_types.text_completion(body)
    assert body["id"] == "cmpl-r1" and body["object"] == "text_completion" and body["model"] == "test"
    assert body["created"] == IDS.created
    assert body["choices"] == [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}]
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (7, 3, 10)
    assert answer.usage is not None and answer.usage.output_tokens == 3


def stream_events(text: str, stop_reason: str) -> list[tuple[str, dict[str, Any]]]:
    start = anthropic_message("", "end_turn") | {"stop_reason": None}
    events = [("message_start", {"type": "message_start", "message": start})]
    events.append(("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}))
    for k in range(0, len(text), 2):
        events.append(("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text[k : k + 2]}}))
    events.append(("content_block_stop", {"index": 0}))
    events.append(("message_delta", {"delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 3}}))
    return [*events, ("message_stop", {})]


def lines(raw: bytes) -> list[Any]:
    out = []
    for line in raw.decode().split("\n\n"):
        if line:
            assert line.startswith("data: ")
            out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "usage"])
def test_a_stream_is_text_completion_chunks_then_done(include_usage: bool) -> None:
    parsed = parse({"stream": True, "stream_options": {"include_usage": include_usage}})
    translator = DIALECT.translator(parsed, IDS)
    raw = b"".join(translator.feed(event, json.dumps(data)) for event, data in stream_events("Hello", "max_tokens"))
    assert translator.done and translator.usage.output_tokens == 3
    chunks = lines(raw + translator.end())
    assert chunks[-1] == "[DONE]"
    if include_usage:
        usage_chunk = chunks[-2]
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 3
        sdk_types.text_completion(usage_chunk)
    texts = [c for c in chunks[:-1] if isinstance(c, dict) and c["choices"]]
    sdk_types.text_completion(texts[-1])  # (the SDK's type wants a finish reason: it reads chunks unchecked)
    for chunk in texts:
        assert chunk["id"] == "cmpl-r1" and chunk["object"] == "text_completion"
    assert [c["choices"][0]["text"] for c in texts] == ["He", "ll", "o", ""]
    assert [c["choices"][0]["finish_reason"] for c in texts] == [None, None, None, "length"]
    assert all(c["choices"][0]["logprobs"] is None and c["choices"][0]["index"] == 0 for c in texts)


def test_the_role_chunk_has_no_counterpart() -> None:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    role = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    assert chunk_to_completion(role) is None
