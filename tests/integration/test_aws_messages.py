"""Claude Platform on AWS and Bedrock's Messages endpoint through the real gateway (gunicorn,
gevent) and the simulator speaking each: SigV4 recomputed with botocore for each one's service
and region, Claude Platform on AWS's ``anthropic-workspace-id`` checked, Anthropic's SSE.

Each serves Chat Completions, the Responses API and ``/v1/messages``, JSON and streams, with
usage at the deployment's price, count_tokens, a workspace key instead of SigV4, and a failover
between each of them and Anthropic's API (both ways round).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest
import requests

from ezat_compat.sim.clouds import (
    BEDROCK_MANTLE,
    BEDROCK_RUNTIME_MESSAGES,
    CLAUDE_PLATFORM_AWS,
    SIM_AWS_ACCESS_KEY_ID,
    SIM_AWS_SECRET_ACCESS_KEY,
    SIM_AWS_WORKSPACE_ID,
)
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration

MANTLE_MODEL = "anthropic.claude-sonnet-5-5"
CLAUDE_CODE_BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
PLATFORM_PRICE = {"input": 4.0, "output": 20.0, "cache_write": 5.0, "cache_read": 1.0}  # whole micro-USD a token
WORKSPACE_KEY = "cpa-workspace-key"


def platform_at(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "claude_platform_aws",
        "base_url": url + CLAUDE_PLATFORM_AWS,
        "region": "us-west-2",
        "workspace_id": SIM_AWS_WORKSPACE_ID,
        **extra,
    }


def mantle_at(url: str, prefix: str = BEDROCK_MANTLE, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "bedrock_messages",
        "base_url": url + prefix,
        "region": "us-east-1",
        "upstream_model": MANTLE_MODEL,
        **extra,
    }


def _model(alias: str, *deployments: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id=f"anthropic/{alias}", aliases=(alias,), deployments=deployments)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim, Sim, str]]:
    root = tmp_path_factory.mktemp("aws-messages")
    sim = Sim(name="aws").start()
    down = Sim(name="anthropic-down", flags=("--fail-status", "529")).start()  # Anthropic's API, overloaded
    (root / "aws-credentials").write_text(
        f"[wrong]\naws_access_key_id = {SIM_AWS_ACCESS_KEY_ID}\naws_secret_access_key = not-the-secret-0123\n"
    )
    (root / "aws-config").write_text("")
    models = [
        _model("on-platform", {"name": "platform", **platform_at(sim.url), "price": PLATFORM_PRICE}),
        _model("on-platform-new", {"name": "platform-2026", **platform_at(sim.url), "anthropic_version": "2026-10-21"}),
        _model("on-platform-key", {"name": "platform-key", **platform_at(sim.url, api_key_env="CPA_KEY")}),
        _model("on-mantle", {"name": "mantle", **mantle_at(sim.url)}),
        _model("on-runtime-messages", {"name": "runtime-messages", **mantle_at(sim.url, BEDROCK_RUNTIME_MESSAGES)}),
        _model(
            "anthropic-then-platform",
            {"name": "anthropic-down", "base_url": down.url, "priority": 0},
            {"name": "platform-next", **platform_at(sim.url), "priority": 1},
        ),
        _model(
            "mantle-then-anthropic",
            {"name": "mantle-bad", **mantle_at(sim.url, aws_profile="wrong"), "priority": 0},
            {"name": "anthropic-next", "base_url": sim.url, "priority": 1},
        ),
    ]
    env = {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "aws-credentials"),
        "AWS_CONFIG_FILE": str(root / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "CPA_KEY": WORKSPACE_KEY,
    }
    gw = Gateway(root=root / "gw", models=models, env=env).start()
    try:
        yield gw, sim, down, gw.new_key("aws-messages", balance="100")
    finally:
        gw.stop()
        sim.stop()
        down.stop()


def _client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0, timeout=30)


def _last(sim: Sim, prefix: str) -> dict[str, Any]:
    return next(r for r in reversed(sim.requests()) if r["path"].startswith(prefix))


ENDPOINTS = {
    "on-platform": (CLAUDE_PLATFORM_AWS, "platform", "aws-external-anthropic", "us-west-2"),
    "on-mantle": (BEDROCK_MANTLE, "mantle", "bedrock-mantle", "us-east-1"),
    "on-runtime-messages": (BEDROCK_RUNTIME_MESSAGES, "runtime-messages", "bedrock", "us-east-1"),
}


def _scope(sent: dict[str, Any]) -> list[str]:
    return sent["headers"]["authorization"].split("Credential=", 1)[1].split(",", 1)[0].split("/")


@pytest.mark.parametrize("alias", list(ENDPOINTS))
def test_chat_json_and_stream_on_each_endpoint(stack: tuple[Gateway, Sim, Sim, str], alias: str) -> None:
    gw, sim, _, key = stack
    prefix, deployment, service, region = ENDPOINTS[alias]
    with _client(gw, key) as client:
        reply = client.chat.completions.create(model=alias, messages=[{"role": "user", "content": "Say hello"}])
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.prompt_tokens > 0
        chunks = list(
            client.chat.completions.create(
                model=alias,
                messages=[{"role": "user", "content": "Say hello again"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens > 0
    sent = _last(sim, prefix)
    assert sent["path"] == prefix + "/v1/messages"
    assert sent["body"]["stream"] is True
    assert sent["body"]["model"] == (MANTLE_MODEL if alias != "on-platform" else "claude-sonnet-5-5")
    assert _scope(sent)[:4][0] == SIM_AWS_ACCESS_KEY_ID and _scope(sent)[2:4] == [region, service]
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    if alias == "on-platform":
        assert sent["headers"]["anthropic-workspace-id"] == SIM_AWS_WORKSPACE_ID
    rows = [r for r in gw.usage() if r["deployment"] == deployment]
    assert len(rows) >= 2 and all(r["status"] == 200 for r in rows)


@pytest.mark.parametrize("alias", list(ENDPOINTS))
def test_native_messages_and_responses_on_each_endpoint(stack: tuple[Gateway, Sim, Sim, str], alias: str) -> None:
    gw, sim, _, key = stack
    prefix = ENDPOINTS[alias][0]
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": CLAUDE_CODE_BETAS}
    body = {"model": alias, "max_tokens": 200, "messages": [{"role": "user", "content": "Hi from Claude Code"}]}
    answer = requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == alias and answer.json()["usage"]["output_tokens"] > 0
    sent = _last(sim, prefix)
    if alias == "on-platform":  # Anthropic's API: the betas pass
        assert sent["headers"]["anthropic-beta"] == CLAUDE_CODE_BETAS
    else:  # Bedrock: only those it takes
        assert sent["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    streamed = requests.post(gw.url + "/v1/messages", json={**body, "stream": True}, headers=headers, timeout=30)
    assert streamed.status_code == 200 and "event: message_stop" in streamed.text
    with _client(gw, key) as client:
        response = client.responses.create(model=alias, input="Hello there")
        assert response.output_text and response.usage is not None and response.usage.output_tokens > 0
        events = list(client.responses.create(model=alias, input="Stream it", stream=True))
    assert events[-1].type == "response.completed"


def test_usage_is_billed_at_the_deployments_price(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, _, _, key = stack
    with _client(gw, key) as client:
        reply = client.chat.completions.create(model="on-platform", messages=[{"role": "user", "content": "Price me"}])
    row = next(r for r in gw.usage() if r["request_id"] == reply.id.removeprefix("chatcmpl-"))
    price = {k: Decimal(str(v)) for k, v in PLATFORM_PRICE.items()}
    expected = (
        row["input_tokens"] * price["input"]
        + row["cache_write_tokens"] * price["cache_write"]
        + row["cache_read_tokens"] * price["cache_read"]
        + row["output_tokens"] * price["output"]
    ) / 1_000_000
    assert Decimal(row["cost_usd"]) == expected.quantize(Decimal("0.000001"))


def test_count_tokens_on_each_endpoint(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, sim, _, key = stack
    body = {"messages": [{"role": "user", "content": "How many tokens is this sentence, roughly?"}]}
    before = len(gw.usage())
    counts = set()
    for alias, (prefix, *_) in ENDPOINTS.items():
        resp = requests.post(
            gw.url + "/v1/messages/count_tokens", json={"model": alias, **body}, headers={"x-api-key": key}, timeout=30
        )
        assert resp.status_code == 200, (alias, resp.text)
        counts.add(resp.json()["input_tokens"])
        assert _last(sim, "/")["path"] == prefix + "/v1/messages/count_tokens"
    assert len(counts) == 1 and counts.pop() > 0
    assert len(gw.usage()) == before  # counting is free


def test_a_workspace_key_goes_instead_of_sigv4(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, sim, _, key = stack
    with _client(gw, key) as client:
        reply = client.chat.completions.create(model="on-platform-key", messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content
    sent = _last(sim, CLAUDE_PLATFORM_AWS)
    assert sent["headers"]["x-api-key"] == WORKSPACE_KEY and "authorization" not in sent["headers"]
    assert sent["headers"]["anthropic-workspace-id"] == SIM_AWS_WORKSPACE_ID


def test_a_2026_deployment_drops_temperature_for_a_2023_client(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, sim, _, key = stack
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    body = {
        "model": "on-platform-new",
        "max_tokens": 50,
        "temperature": 0.2,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    answer = requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    sent = _last(sim, CLAUDE_PLATFORM_AWS)
    assert sent["headers"]["anthropic-version"] == "2026-10-21" and "temperature" not in sent["body"]


def test_a_request_fails_over_from_anthropic_to_claude_platform_on_aws(
    stack: tuple[Gateway, Sim, Sim, str],
) -> None:
    gw, _, down, key = stack
    down.clear()
    with _client(gw, key) as client:
        reply = client.chat.completions.create(
            model="anthropic-then-platform", messages=[{"role": "user", "content": "Fail me over"}]
        )
        chunks = list(
            client.chat.completions.create(
                model="anthropic-then-platform", messages=[{"role": "user", "content": "And stream"}], stream=True
            )
        )
    assert reply.choices[0].message.content and any(c.choices and c.choices[0].delta.content for c in chunks)
    assert [r["path"] for r in down.requests()] and all(r["path"] == "/v1/messages" for r in down.requests())
    row = next(r for r in gw.usage() if r["request_id"] == reply.id.removeprefix("chatcmpl-"))
    assert row["deployment"] == "platform-next" and row["status"] == 200


def test_a_wrong_aws_credential_fails_over_from_the_messages_endpoint_to_anthropic(
    stack: tuple[Gateway, Sim, Sim, str],
) -> None:
    gw, sim, _, key = stack
    sim.clear()
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    body = {"model": "mantle-then-anthropic", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
    answer = requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    paths = [r["path"] for r in sim.requests()]
    assert paths[:1] == [BEDROCK_MANTLE + "/v1/messages"] and paths[-1] == "/v1/messages", paths
    assert "not-the-secret" not in gw.log_text()
    row = next(r for r in gw.usage() if r["request_id"] == answer.headers["request-id"])
    assert row["deployment"] == "anthropic-next"


def test_check_config_names_each_endpoints_credentials(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, _, _, _ = stack
    out = gw.cli("check-config").stdout
    assert "Claude Platform on AWS, region us-west-2, workspace " + SIM_AWS_WORKSPACE_ID in out
    assert "Bedrock's Messages endpoint (bedrock-mantle)" in out and "credentials: AWS SigV4" in out
    assert "credentials: key from CPA_KEY" in out
    assert json.dumps(WORKSPACE_KEY) not in out and WORKSPACE_KEY not in out
