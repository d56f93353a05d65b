"""Cloud deployments through the real gateway (gunicorn, gevent) and the simulator speaking each
provider: Amazon Bedrock (SigV4 verified, event-stream framing), Google Vertex AI (google-auth
running for real against the simulator's token endpoint) and Microsoft Foundry.

Each provider serves Chat Completions, the Responses API and ``/v1/messages``, JSON and streams,
with usage and money exact; Claude Code's betas reach each provider filtered to what it takes;
a wrong AWS credential fails over to another deployment, and alone answers 500
``server_error`` (never 401/403) logged with the deployment's name and no secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import requests

from ezat_compat.sim.clouds import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY
from ezat_compat.translate.cache_marks import cache_marks
from tests.integration.harness import Gateway, ModelSpec, Sim, unscoped
from tests.support.clouds import BEDROCK_MODEL, VERTEX_MODEL, bedrock_at, private_pem, service_account, vertex_at

pytestmark = pytest.mark.integration

OLD_BEDROCK_MODEL = "anthropic.claude-3-7-sonnet-20250219-v1:0"  # before the one-hour cache
WRONG_SECRET = "not-the-right-secret-0123456789"
FOUNDRY_KEY = "foundry-test-key"
CLAUDE_CODE_BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
# bedrock-good's own price: what its requests are billed at, not the model's
BEDROCK_PRICE = {"input": 4.0, "output": 20.0, "cache_write": 5.0, "cache_read": 0.4}


def foundry_at(url: str) -> dict[str, Any]:
    # Hosted on Anthropic: Anthropic's API as it is (Hosted on Azure: tests/integration/test_api_versions.py)
    return {"provider": "foundry", "base_url": url + "/anthropic", "api_key_env": "FOUNDRY_KEY", "hosting": "anthropic"}


def _model(alias: str, *deployments: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id=f"anthropic/{alias}", aliases=(alias,), deployments=deployments)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim, str]]:
    root = tmp_path_factory.mktemp("clouds")
    pem = private_pem()
    service_account(root / "sa-sim.json", "unused", pem)
    sim = Sim(name="cloud", flags=("--google-service-account", str(root / "sa-sim.json"))).start()
    service_account(root / "sa.json", sim.url + "/token", pem)
    (root / "aws-credentials").write_text(
        f"[wrong]\naws_access_key_id = {SIM_AWS_ACCESS_KEY_ID}\naws_secret_access_key = {WRONG_SECRET}\n"
    )
    (root / "aws-config").write_text("")
    bedrock, vertex, foundry = bedrock_at(sim.url), vertex_at(sim.url), foundry_at(sim.url)
    models = [
        _model("on-bedrock", {"name": "bedrock-good", **bedrock, "price": BEDROCK_PRICE}),
        _model("on-vertex", {"name": "vertex-good", **vertex}),
        _model("on-foundry", {"name": "foundry-good", **foundry}),
        _model(
            "bad-then-vertex",
            {"name": "bedrock-bad", **bedrock, "aws_profile": "wrong", "priority": 0},
            {"name": "vertex-next", **vertex, "priority": 1},
        ),
        _model("bad-only", {"name": "bedrock-bad-alone", **bedrock, "aws_profile": "wrong"}),
        _model("old-on-bedrock", {"name": "bedrock-old", **bedrock, "upstream_model": OLD_BEDROCK_MODEL}),
        _model(
            "guarded",
            {
                "name": "bedrock-guarded",
                **bedrock,
                "guardrail": "gr-sim",
                "guardrail_version": "1",
                "service_tier": "flex",
            },
        ),
        _model(
            "search-bedrock-first",
            {"name": "bedrock-first", **bedrock, "priority": 0},
            {"name": "anthropic-second", "base_url": sim.url, "priority": 1},
        ),
    ]
    env = {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "aws-credentials"),
        "AWS_CONFIG_FILE": str(root / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "GOOGLE_APPLICATION_CREDENTIALS": str(root / "sa.json"),
        "FOUNDRY_KEY": FOUNDRY_KEY,
        "ANTHROPIC_API_KEY": "sk-ant-test",  # anthropic-second's
    }
    gw = Gateway(root=root / "gw", models=models, env=env).start()
    try:
        yield gw, sim, gw.new_key("clouds", balance="100")
    finally:
        gw.stop()
        sim.stop()


def _client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/openai/v1", api_key=key, max_retries=0, timeout=30)


def _last(sim: Sim, prefix: str) -> dict[str, Any]:
    return next(r for r in reversed(sim.requests()) if r["path"].startswith(prefix))


PROVIDER_PATHS = {
    "on-bedrock": ("/model/", "bedrock-good"),
    "on-vertex": ("/v1/projects/", "vertex-good"),
    "on-foundry": ("/anthropic/v1/messages", "foundry-good"),
}


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_chat_json_and_stream_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    gw, sim, key = stack
    prefix, deployment = PROVIDER_PATHS[alias]
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
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens > 0
    sent = _last(sim, prefix)
    body = sent["body"]
    if alias == "on-bedrock":
        assert sent["path"] == f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"
        assert body["anthropic_version"] == "bedrock-2023-05-31" and "model" not in body and "stream" not in body
        assert sent["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 Credential=" + SIM_AWS_ACCESS_KEY_ID)
    elif alias == "on-vertex":
        assert sent["path"].endswith(f"/publishers/anthropic/models/{VERTEX_MODEL}:streamRawPredict")
        assert body["anthropic_version"] == "vertex-2023-10-16" and "model" not in body and body["stream"] is True
        assert sent["headers"]["authorization"].startswith("Bearer ya29.sim-")
    else:
        assert sent["headers"]["x-api-key"] == FOUNDRY_KEY and body["model"] == "claude-sonnet-5-5"
    rows = [r for r in gw.usage() if r["deployment"] == deployment]
    assert len(rows) >= 2 and all(r["status"] == 200 for r in rows)


def test_a_deployment_price_overrides_the_models(stack: tuple[Gateway, Sim, str]) -> None:
    gw, _, key = stack
    with _client(gw, key) as client:
        reply = client.chat.completions.create(model="on-bedrock", messages=[{"role": "user", "content": "Price me"}])
    row = next(r for r in gw.usage() if r["request_id"] == reply.id.removeprefix("chatcmpl-"))
    price = {k: Decimal(str(v)) for k, v in BEDROCK_PRICE.items()}
    expected = (
        row["input_tokens"] * price["input"]
        + row["cache_write_tokens"] * price["cache_write"]
        + row["cache_read_tokens"] * price["cache_read"]
        + row["output_tokens"] * price["output"]
    ) / 1_000_000
    assert Decimal(row["cost_usd"]) == expected.quantize(Decimal("0.000001"))


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_native_messages_and_responses_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    gw, sim, key = stack
    prefix, _ = PROVIDER_PATHS[alias]
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "anthropic-beta": CLAUDE_CODE_BETAS}
    body = {"model": alias, "max_tokens": 200, "messages": [{"role": "user", "content": "Hi from Claude Code"}]}
    answer = requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == alias and answer.json()["usage"]["output_tokens"] > 0
    sent = _last(sim, prefix)
    if alias == "on-bedrock":  # Bedrock takes the betas it knows in the body, and no others
        assert sent["body"]["anthropic_beta"] == ["interleaved-thinking-2025-05-14"]
    elif alias == "on-vertex":
        assert sent["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    else:  # Foundry is Anthropic's API: the betas pass
        assert sent["headers"]["anthropic-beta"] == CLAUDE_CODE_BETAS
    streamed = requests.post(gw.url + "/v1/messages", json={**body, "stream": True}, headers=headers, timeout=30)
    assert streamed.status_code == 200 and "event: message_stop" in streamed.text
    with _client(gw, key) as client:
        response = client.responses.create(model=alias, input="Hello there")
    assert response.output_text and response.usage is not None and response.usage.output_tokens > 0


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_structured_output_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    """``response_format: json_schema`` on every provider, JSON and stream: Vertex and Foundry take
    ``output_config.format``; the simulated Bedrock refuses it for Claude Sonnet 5, as the real one
    does, so the gateway tells the model the schema in the system prompt instead (a 200, not a
    400 from the cloud)."""
    gw, sim, key = stack
    prefix, _ = PROVIDER_PATHS[alias]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    with _client(gw, key) as client:
        reply = client.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": "Where?"}], response_format=response_format
        )
        assert reply.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model=alias,
                messages=[{"role": "user", "content": "Where?"}],
                response_format=response_format,
                stream=True,
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    body = _last(sim, prefix)["body"]
    if alias == "on-bedrock":
        assert "format" not in body.get("output_config", {})
        assert json.dumps(schema, separators=(",", ":")) in body["system"][-1]["text"]
    else:
        assert body["output_config"]["format"]["schema"]["properties"] == schema["properties"]
        assert (
            json.loads(reply.choices[0].message.content) == {"city": ""} or "city" in reply.choices[0].message.content
        )


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_an_sdk_message_thread_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    """The gateway holds the thread: each cloud gets every turn whole (its own body shape), and
    neither ``thread`` nor the threads beta reaches it."""
    gw, sim, key = stack
    prefix, _ = PROVIDER_PATHS[alias]
    client = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=30)
    thread = client.beta.messages.thread(model=alias, max_tokens=100, system="Be brief.")
    first = thread.send({"role": "user", "content": "first"})
    with thread.stream({"role": "user", "content": "second"}) as events:
        second = events.get_final_message()
    third = thread.send({"role": "user", "content": "third"})
    assert first.stop_reason == second.stop_reason == third.stop_reason == "end_turn"
    sent = _last(sim, prefix)
    assert "thread" not in sent["body"] and "message-threads" not in json.dumps(sent)
    assert [m["role"] for m in sent["body"]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert sent["body"]["messages"][3]["content"][-1]["text"] == second.content[-1].text
    assert unscoped(sent["body"])["system"] == [{"type": "text", "text": "Be brief."}]


def test_a_wrong_aws_credential_fails_over_then_answers_500(stack: tuple[Gateway, Sim, str]) -> None:
    gw, sim, key = stack
    with _client(gw, key) as client:
        reply = client.chat.completions.create(
            model="bad-then-vertex", messages=[{"role": "user", "content": "Fail over please"}]
        )
        assert reply.choices[0].message.content
        row = next(r for r in gw.usage() if r["request_id"] == reply.id.removeprefix("chatcmpl-"))
        assert row["deployment"] == "vertex-next" and row["status"] == 200
        for _ in range(5):  # past cooldown_failures (3): a wrong credential is no overload, still a 500
            with pytest.raises(openai.InternalServerError) as caught:
                client.chat.completions.create(model="bad-only", messages=[{"role": "user", "content": "No luck"}])
            assert caught.value.status_code == 500
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "server_error"
    refused = [r for r in sim.requests() if r["path"].startswith("/model/") and WRONG_SECRET not in json.dumps(r)]
    assert refused  # the simulator saw the signed requests (and never the secret itself)
    log = gw.log_text()
    assert "bedrock-bad" in log and "bedrock-bad-alone" in log
    for secret in (WRONG_SECRET, SIM_AWS_SECRET_ACCESS_KEY, "Signature="):
        assert secret not in log
    native = requests.post(
        gw.url + "/v1/messages",
        json={"model": "bad-only", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-api-key": key},
        timeout=30,
    )
    assert native.status_code == 500 and native.json()["error"]["type"] == "api_error"


def test_check_config_names_each_provider_and_its_credentials(stack: tuple[Gateway, Sim, str]) -> None:
    gw, _, _ = stack
    done = gw.cli("check-config")
    out = done.stdout
    assert "deployment bedrock-good" in out and "provider: bedrock, region us-east-1" in out
    assert "credentials: AWS SigV4, found by botocore's chain in env" in out
    assert "(profile wrong)" in out  # bedrock-bad's credentials come from its profile
    assert "guardrail gr-sim version 1; service tier flex" in out  # bedrock-guarded's options
    assert "credentials: Google application default credentials (service account gateway@" in out
    assert "provider: foundry" in out and "key: from FOUNDRY_KEY" in out
    for secret in (SIM_AWS_SECRET_ACCESS_KEY, WRONG_SECRET, FOUNDRY_KEY, "PRIVATE KEY"):
        assert secret not in out + done.stderr


def _check_config(gw: Gateway, path: Path) -> subprocess.CompletedProcess[str]:
    """``check-config`` run on the config file at ``path``, in the gateway's environment."""
    return subprocess.run(
        [sys.executable, "-m", "ezat_compat.cli", "--config", str(path), "check-config"],
        capture_output=True,
        text=True,
        env={**os.environ, **gw.env},
        timeout=60,
    )


def test_check_config_says_which_deployments_web_search_skips(stack: tuple[Gateway, Sim, str], tmp_path: Path) -> None:
    gw, _, _ = stack
    model = 'id = "anthropic/search-bedrock-first"\n'
    path = tmp_path / "ezat.toml"
    path.write_text(gw.config_path.read_text().replace(model, model + "web_search = true\n"))
    done = _check_config(gw, path)
    assert done.returncode == 0, done.stderr
    lines = {line.split(" ", 2)[1]: line for line in done.stdout.splitlines() if line.startswith("deployment ")}
    assert "web search: not on bedrock, web-search requests skip it" in lines["bedrock-first"]
    assert "web search" not in lines["anthropic-second"] and "web search" not in lines["bedrock-good"]


def test_check_config_fails_in_one_line_without_credentials(stack: tuple[Gateway, Sim, str], tmp_path: Path) -> None:
    gw, _, _ = stack
    text = gw.config_path.read_text().replace('aws_profile = "wrong"', 'aws_profile = "missing"')
    path = tmp_path / "ezat.toml"
    path.write_text(text)
    done = _check_config(gw, path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bedrock-bad" in lines[0] and "missing" in lines[0]


@pytest.fixture(scope="module")
def wrong_google(stack: tuple[Gateway, Sim, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose application default credentials are a service account the simulator's
    token endpoint doesn't know (another key): Vertex can't get a token."""
    _, sim, _ = stack
    root = tmp_path_factory.mktemp("wrong-google")
    service_account(root / "sa.json", sim.url + "/token", private_pem())  # a key the simulator doesn't know
    vertex, foundry = vertex_at(sim.url), foundry_at(sim.url)
    models = [
        _model(
            "vertex-bad-then-foundry",
            {"name": "vertex-bad", **vertex, "priority": 0},
            {"name": "foundry-next", **foundry, "priority": 1},
        ),
        _model("vertex-bad-only", {"name": "vertex-bad-alone", **vertex}),
    ]
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(root / "sa.json"), "FOUNDRY_KEY": FOUNDRY_KEY}
    gw = Gateway(root=root / "gw", models=models, env=env).start()
    try:
        yield gw
    finally:
        gw.stop()


def test_a_wrong_google_credential_fails_over_then_answers_500(wrong_google: Gateway) -> None:
    gw = wrong_google
    key = gw.new_key("clouds", balance="100")
    with _client(gw, key) as client:
        reply = client.chat.completions.create(
            model="vertex-bad-then-foundry", messages=[{"role": "user", "content": "Fail over please"}]
        )
        assert reply.choices[0].message.content
        row = next(r for r in gw.usage() if r["request_id"] == reply.id.removeprefix("chatcmpl-"))
        assert row["deployment"] == "foundry-next" and row["status"] == 200
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="vertex-bad-only", messages=[{"role": "user", "content": "No"}])
    assert caught.value.status_code == 500  # never a 401: the client's key was fine
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "server_error"
    log = gw.log_text()
    assert "vertex-bad" in log and "vertex-bad-alone" in log
    assert "PRIVATE KEY" not in log and "assertion=" not in log


def _png_data_url() -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_tools_images_reasoning_and_caching_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    gw, sim, key = stack
    prefix, deployment = PROVIDER_PATHS[alias]
    long_system = f"[{alias}] You are a careful assistant who answers briefly. " * 120
    system = {
        "role": "system",
        "content": [{"type": "text", "text": long_system, "cache_control": {"type": "ephemeral"}}],
    }
    ask = 'Weather in Oslo? [[sim:tool=get_weather,args={"city": "Oslo"}]]'
    with _client(gw, key) as client:
        first = client.chat.completions.create(
            model=alias,
            messages=[system, {"role": "user", "content": ask}],
            tools=[WEATHER_TOOL],
            reasoning_effort="high",
            max_completion_tokens=4000,
        )
        assert first.choices[0].finish_reason == "tool_calls"
        (call,) = first.choices[0].message.tool_calls or []
        assert call.type == "function" and json.loads(call.function.arguments) == {"city": "Oslo"}
        assert first.usage is not None and first.usage.completion_tokens_details is not None
        assert (first.usage.completion_tokens_details.reasoning_tokens or 0) > 0  # it thought
        second = client.chat.completions.create(
            model=alias,
            messages=[
                system,
                {"role": "user", "content": ask},
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "Oslo: 9°C"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "And this?"},
                        {"type": "image_url", "image_url": {"url": _png_data_url()}},
                    ],
                },
            ],
            tools=[WEATHER_TOOL],
            reasoning_effort="high",
            max_completion_tokens=4000,
        )
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) > 1024  # the system prompt, read back
    body = _last(sim, prefix)["body"]
    blocks = [b["type"] for m in body["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
    assert "image" in blocks and "tool_result" in blocks and "thinking" in blocks  # its own thinking, put back
    row = next(r for r in gw.usage() if r["request_id"] == second.id.removeprefix("chatcmpl-"))
    assert (
        row["deployment"] == deployment and row["cache_read_tokens"] == second.usage.prompt_tokens_details.cached_tokens
    )
    assert row["input_tokens"] + row["cache_write_tokens"] + row["cache_read_tokens"] == second.usage.prompt_tokens


@pytest.mark.parametrize("alias", list(PROVIDER_PATHS))
def test_a_responses_stream_on_each_provider(stack: tuple[Gateway, Sim, str], alias: str) -> None:
    gw, _, key = stack
    with _client(gw, key) as client:
        events = list(client.responses.create(model=alias, input="Stream me a greeting", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text and done.usage is not None and done.usage.output_tokens > 0


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """A static server on loopback with a PNG and a PDF; the paths it served, in order."""
    import base64
    import functools
    import http.server
    import threading

    folder = tmp_path_factory.mktemp("media")
    (folder / "pic.png").write_bytes(base64.b64decode(_png_data_url().partition(",")[2]))
    (folder / "doc.pdf").write_bytes(b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n")
    served: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()


def _url_sourced_body(alias: str, base: str, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": alias,
        "max_tokens": 64,
        "stream": stream,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "url", "url": f"{base}/pic.png?{alias}"}},
                    {"type": "document", "source": {"type": "url", "url": f"{base}/doc.pdf?{alias}"}},
                    {"type": "text", "text": "What are these?"},
                ],
            }
        ],
    }


@pytest.mark.parametrize("alias", ["on-bedrock", "on-vertex", "on-foundry"])
def test_url_sources_reach_a_cloud_as_base64(
    stack: tuple[Gateway, Sim, str], media_server: tuple[str, list[str]], alias: str
) -> None:
    """Claude on the clouds takes no URL sources (``betas.URL_SOURCES``, with its sources): the
    gateway downloads a native request's image and PDF URLs and sends their bytes."""
    gw, sim, key = stack
    base, served = media_server
    prefix = PROVIDER_PATHS[alias][0]
    for stream in (False, True):
        reply = requests.post(
            gw.url + "/v1/messages",
            json=_url_sourced_body(alias, base, stream=stream),
            headers={"x-api-key": key},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert ("message_stop" in reply.text) if stream else reply.json()["content"]
        sources = [b["source"] for b in _last(sim, prefix)["body"]["messages"][0]["content"] if "source" in b]
        assert [(s["type"], s["media_type"]) for s in sources] == [
            ("base64", "image/png"),
            ("base64", "application/pdf"),
        ]
    assert served.count(f"/pic.png?{alias}") == 2 and served.count(f"/doc.pdf?{alias}") == 2


def test_the_simulated_clouds_refuse_url_sources(stack: tuple[Gateway, Sim, str]) -> None:
    """What the test above relies on: sent as it came, a URL source is a 400 from each cloud."""
    from ezat_compat.upstream.providers.betas import URL_SOURCES

    assert URL_SOURCES == {"anthropic": True, "foundry": False, "bedrock": False, "vertex": False}
    _, sim, _ = stack
    body = _url_sourced_body("x", "https://example.com")
    del body["model"], body["stream"]
    bedrock = requests.post(
        sim.url + f"/model/{BEDROCK_MODEL}/invoke",
        json={**body, "anthropic_version": "bedrock-2023-05-31"},
        headers={"authorization": "Bearer a-bedrock-api-key"},
        timeout=10,
    )
    assert bedrock.status_code == 400 and "messages.0.content.0.image.source" in bedrock.json()["message"]


def test_the_simulated_clouds_refuse_the_betas_they_were_seen_refusing(stack: tuple[Gateway, Sim, str]) -> None:
    from ezat_compat.sim.clouds import BEDROCK_REFUSED_BETAS

    _, sim, _ = stack
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "anthropic_version": "bedrock-2023-05-31"}
    for beta in sorted(BEDROCK_REFUSED_BETAS):
        refused = requests.post(
            sim.url + f"/model/{BEDROCK_MODEL}/invoke",
            json={**body, "anthropic_beta": [beta]},
            headers={"authorization": "Bearer a-bedrock-api-key"},
            timeout=10,
        )
        assert refused.status_code == 400 and "invalid beta flag" in refused.json()["message"], beta
    ok = requests.post(
        sim.url + f"/model/{BEDROCK_MODEL}/invoke",
        json={**body, "anthropic_beta": ["interleaved-thinking-2025-05-14"]},
        headers={"authorization": "Bearer a-bedrock-api-key"},
        timeout=10,
    )
    assert ok.status_code == 200, ok.text


COUNT_PATHS = {
    "on-bedrock": f"/model/{BEDROCK_MODEL}/count-tokens",
    "on-vertex": "/v1/projects/ezat-sim/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict",
    "on-foundry": "/anthropic/v1/messages/count_tokens",
}


def test_count_tokens_on_each_provider(stack: tuple[Gateway, Sim, str]) -> None:
    """``/v1/messages/count_tokens`` (Claude Code calls it) reaches each cloud's own token
    counting: Bedrock's CountTokens (the InvokeModel body as base64), Vertex AI's
    count-tokens:rawPredict (the model in the body), Foundry's Anthropic path; each answers
    Anthropic's ``{"input_tokens": N}``, the same count for the same request, and is not billed."""
    gw, sim, key = stack
    body = {
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "How many tokens is this sentence, roughly?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
    }
    before = len(gw.usage())
    counts = {}
    for alias, path in COUNT_PATHS.items():
        resp = requests.post(
            gw.url + "/v1/messages/count_tokens",
            json={"model": alias, **body},
            headers={"x-api-key": key, "anthropic-beta": CLAUDE_CODE_BETAS},
            timeout=30,
        )
        assert resp.status_code == 200, (alias, resp.text)
        assert set(resp.json()) == {"input_tokens"}
        counts[alias] = resp.json()["input_tokens"]
        seen = _last(sim, "/")
        assert seen["path"] == path.replace(":", "%3A") or seen["path"] == path, (alias, seen["path"])
    assert len(set(counts.values())) == 1 and next(iter(counts.values())) > 0, counts
    assert len(gw.usage()) == before  # counting is free


def test_bedrocks_count_tokens_takes_a_profiles_foundation_model() -> None:
    from ezat_compat.upstream.providers.bedrock import counting_model

    assert counting_model("us.anthropic.claude-sonnet-5-5-v1:0") == "anthropic.claude-sonnet-5-5-v1:0"
    assert counting_model("global.anthropic.claude-x") == "anthropic.claude-x"
    assert counting_model("anthropic.claude-x") == "anthropic.claude-x"
    arn = "arn:aws:bedrock:us-east-1:123:inference-profile/us.anthropic.claude-x"
    assert counting_model(arn) == arn


def _native(gw: Gateway, key: str, body: dict[str, Any], betas: str = "") -> requests.Response:
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    if betas:
        headers["anthropic-beta"] = betas
    return requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)


def test_a_tool_bedrock_lacks_goes_to_the_models_other_deployment(stack: tuple[Gateway, Sim, str]) -> None:
    """Web search isn't on Bedrock (Claude Code's feature availability): a request declaring it
    passes the Bedrock deployment over, even in the first tier, and never reaches it."""
    gw, sim, key = stack
    sim.clear()
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    body = {"model": "search-bedrock-first", "max_tokens": 100, "tools": [search]}
    for stream in (False, True):
        ask = {**body, "stream": stream, "messages": [{"role": "user", "content": f"Search it (stream={stream})"}]}
        answer = _native(gw, key, ask)
        assert answer.status_code == 200, answer.text
    plain = _native(gw, key, {**body, "tools": [], "messages": [{"role": "user", "content": "No tools"}]})
    assert plain.status_code == 200
    paths = [r["path"] for r in sim.requests()]
    assert paths == ["/v1/messages", "/v1/messages", f"/model/{BEDROCK_MODEL}/invoke"]  # the first tier otherwise
    served = sorted(r["deployment"] for r in gw.usage() if r["deployment"] in ("bedrock-first", "anthropic-second"))
    assert served == ["anthropic-second", "anthropic-second", "bedrock-first"]


@pytest.mark.parametrize(
    ("alias", "tool"),
    [
        ("on-vertex", {"type": "web_fetch_20250910", "name": "web_fetch"}),
        ("on-vertex", {"type": "code_execution_20250825", "name": "code_execution"}),
        ("on-bedrock", {"type": "web_search_20250305", "name": "web_search"}),
    ],
)
def test_a_tool_no_deployment_offers_is_a_400_that_never_leaves(
    stack: tuple[Gateway, Sim, str], alias: str, tool: dict[str, Any]
) -> None:
    gw, sim, key = stack
    sim.clear()
    body = {"model": alias, "max_tokens": 100, "tools": [tool], "messages": [{"role": "user", "content": "Go"}]}
    answer = _native(gw, key, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(f"Model anthropic/{alias} can't use {tool['type']}:")
    assert sim.requests() == []  # nothing the cloud would refuse was sent
    row = next(r for r in gw.usage() if r["request_id"] == answer.headers["request-id"])
    assert row["status"] == 400 and Decimal(row["cost_usd"]) == 0


def test_fast_mode_reaches_a_cloud_as_a_standard_request(stack: tuple[Gateway, Sim, str]) -> None:
    """``speed`` exists only with the fast-mode beta, which neither cloud takes: both go."""
    gw, sim, key = stack
    for alias, prefix in (("on-bedrock", "/model/"), ("on-vertex", "/v1/projects/")):
        body = {"model": alias, "max_tokens": 50, "speed": "fast", "messages": [{"role": "user", "content": "Quick"}]}
        answer = _native(gw, key, body, betas="fast-mode-2026-02-01")
        assert answer.status_code == 200, answer.text
        sent = _last(sim, prefix)
        assert "speed" not in sent["body"] and "fast-mode" not in json.dumps(sent["body"])
        assert "fast-mode" not in sent["headers"].get("anthropic-beta", "")


def test_the_simulated_bedrock_refuses_what_it_lacks(stack: tuple[Gateway, Sim, str]) -> None:
    """Sent straight to the simulator (past the gateway), as a regression would send them."""
    _, sim, _ = stack
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "anthropic_version": "bedrock-2023-05-31"}
    search = {"type": "web_search_20250305", "name": "web_search"}
    for extra, words in (
        ({"tools": [search]}, "tools.0: Input tag 'web_search_20250305' found using 'type'"),
        ({"speed": "fast"}, "speed: Extra inputs are not permitted"),
    ):
        refused = requests.post(
            sim.url + f"/model/{BEDROCK_MODEL}/invoke",
            json={**body, **extra},
            headers={"authorization": "Bearer a-bedrock-api-key"},
            timeout=10,
        )
        assert refused.status_code == 400 and refused.headers["x-amzn-ErrorType"].startswith("ValidationException")
        assert refused.json()["message"].startswith("The model returned the following errors: " + words)


BLOCK = "Tell me about the forbidden topic [[sim:guardrail]]"


def test_a_bedrock_guardrail_and_service_tier_go_with_every_invocation(stack: tuple[Gateway, Sim, str]) -> None:
    """The deployment's guardrail and service tier reach InvokeModel as its header fields,
    signed (the simulator verifies SigV4 over them); an answer the guardrail lets through is an
    ordinary one."""
    gw, sim, key = stack
    with _client(gw, key) as client:
        reply = client.chat.completions.create(model="guarded", messages=[{"role": "user", "content": "Hello"}])
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
    sent = _last(sim, "/model/")
    assert sent["headers"]["x-amzn-bedrock-guardrailidentifier"] == "gr-sim"
    assert sent["headers"]["x-amzn-bedrock-guardrailversion"] == "1"
    assert sent["headers"]["x-amzn-bedrock-service-tier"] == "flex"
    assert "x-amzn-bedrock-service-tier" in sent["headers"]["authorization"]  # among the signed fields


def test_a_guardrails_intervention_is_a_content_filter_on_every_route(stack: tuple[Gateway, Sim, str]) -> None:
    """Bedrock ends a blocked answer with stop reason ``guardrail_intervened``: Chat Completions
    says ``content_filter`` (JSON and stream), the Responses API an incomplete response for
    ``content_filter``, and ``/v1/messages`` passes it on; each is billed as answered."""
    gw, _, key = stack
    with _client(gw, key) as client:
        blocked = client.chat.completions.create(model="guarded", messages=[{"role": "user", "content": BLOCK}])
        assert blocked.choices[0].finish_reason == "content_filter"
        assert blocked.choices[0].message.content == "Sorry, the model cannot answer this question."
        chunks = list(
            client.chat.completions.create(model="guarded", messages=[{"role": "user", "content": BLOCK}], stream=True)
        )
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
            "content_filter"
        ]
        response = client.responses.create(model="guarded", input=BLOCK)
        assert response.status == "incomplete" and response.incomplete_details is not None
        assert response.incomplete_details.reason == "content_filter"
        streamed = list(client.responses.create(model="guarded", input=BLOCK, stream=True))
        assert streamed[-1].type == "response.incomplete"
    native = _native(gw, key, {"model": "guarded", "max_tokens": 50, "messages": [{"role": "user", "content": BLOCK}]})
    assert native.status_code == 200 and native.json()["stop_reason"] == "guardrail_intervened"
    rows = [r for r in gw.usage() if r["deployment"] == "bedrock-guarded"]
    assert len(rows) >= 5 and all(r["status"] == 200 and r["output_tokens"] > 0 for r in rows)


def test_an_older_bedrock_model_gets_its_cache_marks_without_a_ttl(stack: tuple[Gateway, Sim, str]) -> None:
    """Claude Sonnet 3.7 on Bedrock refuses ``cache_control.ttl``: the marks go with the default
    five minutes, and the answer is a 200; sent as the client wrote it, the simulator refuses."""
    gw, sim, key = stack
    hour = {"type": "ephemeral", "ttl": "1h"}
    body = {
        "model": "old-on-bedrock",
        "max_tokens": 50,
        "system": [{"type": "text", "text": "You are brief. " * 300, "cache_control": hour}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": hour}]}],
    }
    for stream in (False, True):
        answer = _native(gw, key, {**body, "stream": stream})
        assert answer.status_code == 200, answer.text
        sent = _last(sim, f"/model/{OLD_BEDROCK_MODEL}")["body"]
        marks = list(cache_marks([sent["system"], sent["messages"]]))  # the scope block's included
        assert len(marks) >= 2 and all(mark == {"type": "ephemeral"} for mark in marks)
        assert unscoped(sent)["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    direct = {k: v for k, v in body.items() if k != "model"} | {"anthropic_version": "bedrock-2023-05-31"}
    refused = requests.post(
        sim.url + f"/model/{OLD_BEDROCK_MODEL}/invoke",
        json=direct,
        headers={"authorization": "Bearer a-bedrock-api-key"},
        timeout=10,
    )
    assert refused.status_code == 400
    assert refused.json()["message"].endswith("system.0.cache_control.ttl: Extra inputs are not permitted")
