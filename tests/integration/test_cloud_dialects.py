"""Bedrock's InvokeModel and Vertex AI's rawPredict served by the real gateway (gunicorn, gevent)
on the same pipeline as native Messages: the model id of the URL mapped to the catalog, the
body's ``anthropic_version``/``anthropic_beta`` handled, Bedrock's event-stream framing (decoded
with botocore's parser), each cloud's error envelope, usage billed to the key.

Bedrock is spoken in raw HTTP (no boto3: a Bedrock API key is a bearer); Vertex through the
``anthropic`` SDK's ``AnthropicVertex`` pointed at the gateway with the key as its access token.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
import requests
from botocore.eventstream import EventStreamBuffer

from ezat_compat.sim.clouds import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY
from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.clouds import bedrock_at, private_pem, service_account, vertex_at

pytestmark = pytest.mark.integration

PROFILE = "us.anthropic.claude-sonnet-5-5-20260101-v1:0"  # maps to claude-sonnet-5-5 by the rule
BEDROCK_BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Say hello."}],
}
CORAL = ":http://internal.amazon.com/coral/com.amazon.bedrock/"


def _invoke(
    gateway: Gateway,
    key: str | None,
    body: Any,
    *,
    op: str = "invoke",
    model: str = PROFILE,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    sent = {"content-type": "application/json", **(headers or {})}
    if key:
        sent["authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{gateway.url}/model/{model}/{op}", data=data, headers=sent, timeout=30)


def _messages(raw: bytes) -> list[Any]:
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    return list(buffer)


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for message in _messages(raw):
        assert message.headers[":message-type"] == "event" and message.headers[":event-type"] == "chunk"
        out.append(json.loads(base64.b64decode(json.loads(message.payload)["bytes"])))
    return out


def test_bedrock_invoke_json_names_the_model_as_sent_and_keeps_the_betas(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    body = {**BEDROCK_BODY, "anthropic_beta": ["interleaved-thinking-2025-05-14"]}
    r = _invoke(gateway, key, body, headers={"anthropic-beta": "context-1m-2025-08-07"})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["type"] == "message" and reply["content"][0]["type"] == "text"
    assert reply["model"] == PROFILE and reply["usage"]["output_tokens"] > 0
    assert r.headers["x-amzn-RequestId"]
    (call,) = [c for c in sim.requests() if c["path"] == "/v1/messages"]
    assert call["body"]["model"] == "claude-sonnet-5-5"
    assert "anthropic_version" not in call["body"] and "anthropic_beta" not in call["body"]
    betas = call["headers"]["anthropic-beta"].split(",")
    assert "interleaved-thinking-2025-05-14" in betas and "context-1m-2025-08-07" in betas


def test_bedrock_stream_is_aws_event_stream(gateway: Gateway, key: str, sim: Sim) -> None:
    r = _invoke(gateway, key, BEDROCK_BODY, op="invoke-with-response-stream")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/vnd.amazon.eventstream"
    events = _events(r.content)
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert events[0]["message"]["model"] == PROFILE
    assert "content_block_delta" in kinds


def test_bedrock_stream_failure_after_the_start_is_an_exception_message(gateway: Gateway, key: str) -> None:
    body = {**BEDROCK_BODY, "messages": [{"role": "user", "content": "Hi [[sim:error_after=3]]"}]}
    r = _invoke(gateway, key, body, op="invoke-with-response-stream")
    assert r.status_code == 200
    last = _messages(r.content)[-1]
    assert last.headers[":message-type"] == "exception"
    assert last.headers[":exception-type"] == "serviceUnavailableException"
    assert json.loads(last.payload)["message"]


def test_bedrock_count_tokens(gateway: Gateway, key: str) -> None:
    encoded = base64.b64encode(json.dumps(BEDROCK_BODY).encode()).decode()
    r = _invoke(gateway, key, {"input": {"invokeModel": {"body": encoded}}}, op="count-tokens")
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"inputTokens"} and r.json()["inputTokens"] > 0


@pytest.mark.parametrize(
    ("case", "status", "kind", "words"),
    [
        ("unknown model", 400, "ValidationException", "The provided model identifier is invalid."),
        ("no anthropic_version", 400, "ValidationException", "anthropic_version"),
        ("bad anthropic_version", 400, "ValidationException", "bedrock-2023-05-31"),
        ("betas not a list", 400, "ValidationException", "anthropic_beta"),
        ("not JSON", 400, "ValidationException", ""),
        ("not an object", 400, "ValidationException", "JSON object"),
        ("no key", 403, "UnrecognizedClientException", "Missing API key"),
        ("SigV4", 403, "UnrecognizedClientException", "AWS_BEARER_TOKEN_BEDROCK"),
        ("upstream overloaded", 503, "ServiceUnavailableException", ""),
        ("count of a converse body", 400, "ValidationException", "input.converse"),
        ("no such operation", 404, "ResourceNotFoundException", ""),
    ],
)
def test_bedrock_errors_in_bedrocks_shape(
    gateway: Gateway, key: str, case: str, status: int, kind: str, words: str
) -> None:
    body: Any = dict(BEDROCK_BODY)
    op, model, headers = "invoke", PROFILE, {}
    use_key: str | None = key
    if case == "unknown model":
        model = "us.anthropic.claude-nothing-1-v1:0"
    elif case == "no anthropic_version":
        del body["anthropic_version"]
    elif case == "bad anthropic_version":
        body["anthropic_version"] = "vertex-2023-10-16"
    elif case == "betas not a list":
        body["anthropic_beta"] = "interleaved-thinking-2025-05-14"
    elif case == "not JSON":
        body = b"{not json"
    elif case == "not an object":
        body = [1, 2]
    elif case == "no key":
        use_key = None
    elif case == "SigV4":
        use_key = None
        headers = {
            "authorization": "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/bedrock/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=00"
        }
    elif case == "upstream overloaded":
        body["messages"] = [{"role": "user", "content": "Hi [[sim:status=529]]"}]
    elif case == "count of a converse body":
        op, body = "count-tokens", {"input": {"converse": {"messages": []}}}
    elif case == "no such operation":
        op = "converse"
    r = _invoke(gateway, use_key, body, op=op, model=model, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["x-amzn-ErrorType"] == kind + CORAL
    assert set(r.json()) == {"message"} and words in r.json()["message"]


def test_bedrock_usage_is_billed_to_the_key(gateway: Gateway) -> None:
    key = gateway.new_key("bedrock-billing")
    assert _invoke(gateway, key, BEDROCK_BODY).status_code == 200
    assert _invoke(gateway, key, BEDROCK_BODY, op="invoke-with-response-stream").status_code == 200
    rows = [r for r in gateway.usage() if r["org"] == "bedrock-billing"]
    assert len(rows) == 2 and {r["endpoint"] for r in rows} == {"messages"}
    assert all(r["status"] == 200 and r["model"] == PROFILE and r["output_tokens"] > 0 for r in rows)


# ---------------------------------------------------------------- Vertex AI


def _vertex(gateway: Gateway, key: str) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region="us-east5", project_id="acme-prj", access_token=key, base_url=gateway.url + "/v1", max_retries=0
    )


def test_vertex_sdk_json_stream_and_count(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    client = _vertex(gateway, key)
    message = client.messages.create(
        model="claude-sonnet-5-5@20260101", max_tokens=64, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.content[0].type == "text" and message.model == "claude-sonnet-5-5@20260101"
    with client.messages.stream(
        model="claude-haiku-4-5@20251001", max_tokens=64, messages=[{"role": "user", "content": "Say hello."}]
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0 and final.model == "claude-haiku-4-5@20251001"
    counted = client.messages.count_tokens(
        model="claude-sonnet-5-5@20260101", messages=[{"role": "user", "content": "Say hello."}]
    )
    assert counted.input_tokens > 0
    calls = [c for c in sim.requests() if c["path"].startswith("/v1/messages")]
    assert sorted(c["path"] for c in calls) == ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]
    haiku = [r for r in gateway.usage() if r["model"] == "claude-haiku-4-5@20251001"]
    assert haiku and haiku[-1]["canonical_model"] == "anthropic/claude-haiku-4-5"
    assert all("anthropic_version" not in c["body"] for c in calls)


def test_vertex_betas_from_the_header_reach_the_upstream(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    client = _vertex(gateway, key)
    client.messages.create(
        model="claude-sonnet-5-5",
        max_tokens=64,
        messages=[{"role": "user", "content": "Say hello."}],
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    (call,) = [c for c in sim.requests() if c["path"] == "/v1/messages"]
    assert call["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14"


VERTEX_PATH = "/v1/projects/acme-prj/locations/us-east5/publishers/anthropic/models/"


@pytest.mark.parametrize(
    ("case", "status", "name", "words"),
    [
        ("unknown model", 404, "NOT_FOUND", "Publisher Model `projects/acme-prj/locations/us-east5/publishers"),
        ("no anthropic_version", 400, "INVALID_ARGUMENT", "anthropic_version"),
        ("no key", 401, "UNAUTHENTICATED", "Missing API key"),
        ("count without a model", 400, "INVALID_ARGUMENT", "model"),
        ("upstream rate limited", 429, "RESOURCE_EXHAUSTED", ""),
        ("no such method", 404, "NOT_FOUND", ""),
    ],
)
def test_vertex_errors_in_googles_shape(
    gateway: Gateway, key: str, case: str, status: int, name: str, words: str
) -> None:
    body: dict[str, Any] = {
        "anthropic_version": "vertex-2023-10-16",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    spec, headers = "claude-sonnet-5-5:rawPredict", {"authorization": f"Bearer {key}"}
    if case == "unknown model":
        spec = "claude-nothing-1@20260101:rawPredict"
    elif case == "no anthropic_version":
        del body["anthropic_version"]
    elif case == "no key":
        headers = {}
    elif case == "count without a model":
        spec = "count-tokens:rawPredict"
    elif case == "upstream rate limited":
        body["messages"] = [{"role": "user", "content": "Hi [[sim:status=429]]"}]
    elif case == "no such method":
        spec = "claude-sonnet-5-5:predict"
    r = requests.post(gateway.url + VERTEX_PATH + spec, json=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["code"], error["status"]) == (status, name) and words in error["message"]


def test_vertex_usage_is_billed_to_the_key(gateway: Gateway) -> None:
    key = gateway.new_key("vertex-billing")
    client = _vertex(gateway, key)
    client.messages.create(
        model="claude-sonnet-5-5@20260101", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    )
    rows = [r for r in gateway.usage() if r["org"] == "vertex-billing"]
    assert len(rows) == 1 and rows[0]["endpoint"] == "messages" and rows[0]["status"] == 200
    assert (
        rows[0]["model"] == "claude-sonnet-5-5@20260101" and rows[0]["canonical_model"] == "anthropic/claude-sonnet-5-5"
    )


def test_bedrock_sdk_with_the_key_as_its_api_key(gateway: Gateway, key: str) -> None:
    client = anthropic.AnthropicBedrock(api_key=key, base_url=gateway.url, aws_region="us-east-1", max_retries=0)
    message = client.messages.create(model=PROFILE, max_tokens=64, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].type == "text" and message.model == PROFILE
    with client.messages.stream(model=PROFILE, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0 and final.stop_reason == "end_turn"


def test_a_sigv4_request_with_the_key_in_x_api_key_is_served(gateway: Gateway, key: str) -> None:
    signed = (
        "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=00"
    )
    r = _invoke(gateway, None, BEDROCK_BODY, headers={"authorization": signed, "x-api-key": key})
    assert r.status_code == 200, r.text


def test_bedrock_keep_alive_is_a_ping_chunk_the_sdk_skips(gateway: Gateway, key: str) -> None:
    """The gateway's keep-alive (``keepalive_s`` 1 here) while the upstream is silent."""
    body: dict[str, Any] = {**BEDROCK_BODY, "messages": [{"role": "user", "content": "Hi [[sim:stall=2.5]]"}]}
    r = _invoke(gateway, key, body, op="invoke-with-response-stream")
    assert r.status_code == 200
    events = _events(r.content)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert [e["type"] for e in events].count("ping") >= 2  # the upstream's own and the gateway's
    client = anthropic.AnthropicBedrock(api_key=key, base_url=gateway.url, aws_region="us-east-1", max_retries=0)
    with client.messages.stream(model=PROFILE, max_tokens=64, messages=body["messages"]) as stream:
        assert stream.get_final_message().stop_reason == "end_turn"


# ---------------------------------------------------------------- failover across providers


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    """Two models, each first on an Anthropic deployment that answers 529, then on a cloud:
    ``claude-on-bedrock`` on a Bedrock deployment (SigV4 checked), ``claude-on-vertex`` on a
    Vertex one (a service account's tokens), all spoken by simulators."""
    root = tmp_path_factory.mktemp("clouds")
    pem = private_pem()
    service_account(root / "sa-sim.json", "unused", pem)
    sims = [
        Sim(name="down", flags=("--fail-status", "529")).start(),
        Sim(name="bedrock").start(),
        Sim(name="vertex", flags=("--google-service-account", str(root / "sa-sim.json"))).start(),
    ]
    down, bedrock, vertex = sims
    service_account(root / "sa.json", vertex.url + "/token", pem)
    (root / "aws-config").write_text("")
    first = {"name": "down", "base_url": down.url, "priority": 0}
    models = [
        ModelSpec(
            id="anthropic/claude-on-bedrock",
            aliases=("claude-on-bedrock",),
            deployments=[first, {"name": "bedrock", **bedrock_at(bedrock.url), "priority": 1}],
        ),
        ModelSpec(
            id="anthropic/claude-on-vertex",
            aliases=("claude-on-vertex",),
            deployments=[first, {"name": "vertex", **vertex_at(vertex.url), "priority": 1}],
        ),
    ]
    env = {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(root / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "GOOGLE_APPLICATION_CREDENTIALS": str(root / "sa.json"),
    }
    gateway = Gateway(root=root / "gw", models=models, env=env).start()
    try:
        yield gateway, gateway.new_key("clouds")
    finally:
        gateway.stop()
        for sim in sims:
            sim.stop()


def test_a_bedrock_client_fails_over_to_a_vertex_deployment(clouds: tuple[Gateway, str]) -> None:
    gateway, key = clouds
    model = "us.anthropic.claude-on-vertex-v1:0"
    r = _invoke(gateway, key, BEDROCK_BODY, op="invoke-with-response-stream", model=model)
    assert r.status_code == 200, r.text
    kinds = [e["type"] for e in _events(r.content)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert _invoke(gateway, key, BEDROCK_BODY, model=model).status_code == 200
    rows = [r for r in gateway.usage() if r["model"] == model]
    assert len(rows) == 2 and all(r["deployment"] == "vertex" and r["status"] == 200 for r in rows), rows


def test_a_vertex_client_fails_over_to_a_bedrock_deployment(clouds: tuple[Gateway, str]) -> None:
    gateway, key = clouds
    client = _vertex(gateway, key)
    params: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    with client.messages.stream(model="claude-on-bedrock@20260101", **params) as stream:
        assert stream.get_final_message().stop_reason == "end_turn"
    assert client.messages.create(model="claude-on-bedrock@20260101", **params).content[0].type == "text"
    counted = client.messages.count_tokens(model="claude-on-bedrock@20260101", messages=params["messages"])
    assert counted.input_tokens > 0
    rows = [r for r in gateway.usage() if r["model"] == "claude-on-bedrock@20260101"]
    assert len(rows) == 2 and all(r["deployment"] == "bedrock" and r["status"] == 200 for r in rows), rows


ROUTES = {
    "invoke": f"/model/{PROFILE}/invoke",
    "invoke stream": f"/model/{PROFILE}/invoke-with-response-stream",
    "bedrock count": f"/model/{PROFILE}/count-tokens",
    "rawPredict": VERTEX_PATH + "claude-sonnet-5-5:rawPredict",
    "streamRawPredict": VERTEX_PATH + "claude-sonnet-5-5:streamRawPredict",
    "vertex count": VERTEX_PATH + "count-tokens:rawPredict",
}
HOSTILE = {
    "empty": b"",
    "not UTF-8": b'{"anthropic_version": "\\xff\xff"}',
    "null": b"null",
    "nested": b"[" * 5000 + b"]" * 5000,
    "messages null": b'{"anthropic_version": "bedrock-2023-05-31", "messages": null, "max_tokens": 1}',
    "max_tokens huge": b'{"anthropic_version": "vertex-2023-10-16", "max_tokens": 1e400, "messages": []}',
    "betas of objects": b'{"anthropic_version": "bedrock-2023-05-31", "anthropic_beta": [{}], "max_tokens": 1}',
    "input a string": b'{"input": "x", "model": 5, "anthropic_version": "vertex-2023-10-16"}',
    "lone surrogate": b'{"anthropic_version": "\\ud800", "model": "\\ud800", "messages": []}',
}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("body", sorted(HOSTILE))
def test_hostile_bodies_are_a_4xx_never_a_5xx(gateway: Gateway, key: str, route: str, body: str) -> None:
    r = requests.post(
        gateway.url + ROUTES[route],
        data=HOSTILE[body],
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=30,
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
