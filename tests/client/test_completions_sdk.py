"""The legacy Completions API (``POST /openai/v1/completions``) through the real gateway and the
strict simulator, with the openai Python SDK (``client.completions.create``, JSON and stream),
as llama-index's ``OpenAILike`` and older tools call it; billed as ``completions``."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration
MODEL = "anthropic/claude-sonnet-5-5"


def client_of(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0, timeout=30)


def test_a_completion_is_one_user_message_and_a_text_completion(gateway: Gateway, sim: Sim) -> None:
    key = gateway.new_key("cmpl-json")
    raw = client_of(gateway, key).completions.with_raw_response.create(
        model=MODEL, prompt=["Say hello"], max_tokens=40, stop=["END"], temperature=0.5, user="u1", seed=7
    )
    completion = raw.parse()
    assert completion.id == "cmpl-" + raw.headers["x-request-id"]
    assert completion.object == "text_completion" and completion.model == MODEL
    (choice,) = completion.choices
    assert choice.index == 0 and choice.logprobs is None and choice.finish_reason == "stop"
    assert choice.text.endswith("You said: Say hello")
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    sent = sim.bodies()[-1]
    ((message, (block,)),) = [(m, m["content"]) for m in sent["messages"]]
    assert message["role"] == "user" and block["type"] == "text" and block["text"] == "Say hello"
    assert sent["max_tokens"] == 40 and sent["stop_sequences"] == ["END"]
    assert "user" not in sent and "seed" not in sent
    (row,) = gateway.usage("--org", "cmpl-json")
    assert row["endpoint"] == "completions" and row["status"] == 200 and float(row["cost_usd"]) > 0
    assert row["output_tokens"] == completion.usage.completion_tokens


def test_the_default_limit_is_sixteen_tokens(gateway: Gateway, key: str, sim: Sim) -> None:
    completion = client_of(gateway, key).completions.create(model=MODEL, prompt="Count [[sim:words=40]]")
    assert sim.bodies()[-1]["max_tokens"] == 16
    assert completion.choices[0].finish_reason == "length"


def test_a_streamed_completion_sends_text_chunks_then_the_usage(gateway: Gateway) -> None:
    key = gateway.new_key("cmpl-stream")
    chunks = list(
        client_of(gateway, key).completions.create(
            model=MODEL, prompt="Say hello", max_tokens=40, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(c.object == "text_completion" and c.id.startswith("cmpl-") for c in chunks)
    texts = [c for c in chunks if c.choices]
    assert all(c.choices[0].logprobs is None and c.choices[0].index == 0 for c in texts)
    assert "".join(c.choices[0].text for c in texts).endswith("You said: Say hello")
    assert [c.choices[0].finish_reason for c in texts][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in texts[:-1])
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    (row,) = gateway.usage("--org", "cmpl-stream")
    assert row["endpoint"] == "completions" and row["output_tokens"] == usage.usage.completion_tokens


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        pytest.param({"suffix": "end"}, "suffix", id="suffix"),
        pytest.param({"echo": True}, "echo", id="echo"),
        pytest.param({"logprobs": 2}, "logprobs", id="logprobs"),
        pytest.param({"best_of": 3}, "best_of", id="best-of"),
        pytest.param({"n": 2}, "n", id="n"),
        pytest.param({"prompt": ["a", "b"]}, "prompt", id="two-prompts"),
        pytest.param({"max_tokens": 10_000_000}, "max_tokens", id="over-the-model-limit"),
    ],
)
def test_refused_fields_are_a_400_naming_the_field(
    gateway: Gateway, key: str, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "prompt": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(gateway, key).completions.create(**body)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and error["message"].startswith(f"{param}: ")
    assert error["type"] == "invalid_request_error"
