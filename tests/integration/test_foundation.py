"""The first round trip and every error envelope, through the real gateway (gunicorn, gevent)
and the simulator, with the official openai SDK (Chat Completions reference, "Request and response", "Errors")."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest
import requests
from sqlalchemy import update

from ezat_compat.config import load_config
from ezat_compat.store.db import make_engine
from ezat_compat.store.tables import api_keys
from tests.integration.harness import Gateway, Sim, unscoped
from tests.support.anthropic_types import validate_anthropic_request

MODEL = "anthropic/claude-sonnet-5-5"
pytestmark = pytest.mark.integration


def client(gateway: Gateway, key: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/openai/v1", api_key=key, max_retries=0, **kwargs)


def post(
    gateway: Gateway,
    body: Any,
    key: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    path: str = "/openai/v1/chat/completions",
) -> requests.Response:
    all_headers = {"content-type": "application/json", **(headers or {})}
    if key:
        all_headers["authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(gateway.url + path, data=data, headers=all_headers, timeout=30)


def simple(model: str = MODEL, text: str = "What is a prompt cache?") -> dict[str, Any]:
    return {"model": model, "max_completion_tokens": 64, "messages": [{"role": "user", "content": text}]}


def assert_envelope(
    resp: requests.Response,
    status: int,
    type_: str,
    code: str | None,
    message: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers.get("request-id")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (type_, code)
    if message is not None:
        assert error["message"] == message
    if param is not None:
        assert error["param"] == param
    return error


# ---------------------------------------------------------------- the round trip


def test_the_spec_example_with_the_openai_sdk(gateway: Gateway, key: str, sim: Sim) -> None:
    sim.clear()
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model=MODEL,
        max_completion_tokens=64,
        messages=[
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is a prompt cache?"},
        ],
    )
    completion = raw.parse()
    assert completion.id == "chatcmpl-" + raw.headers["request-id"]
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert len(completion.choices) == 1 and completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content and completion.choices[0].message.refusal is None
    usage = completion.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None and usage.completion_tokens_details.reasoning_tokens == 0

    (received,) = sim.requests()
    body = received["body"]
    validate_anthropic_request(body)
    assert body["model"] == "claude-sonnet-5-5" and body["max_tokens"] == 64
    assert unscoped(body)["system"][0]["text"] == "Answer in one sentence."
    assert received["headers"]["x-api-key"] == "sk-ant-test"
    assert received["headers"]["anthropic-version"] == "2023-06-01"


def test_model_is_echoed_exactly_as_sent(gateway: Gateway, key: str) -> None:
    completion = client(gateway, key).chat.completions.create(
        model="  Claude-Sonnet-5.5 ", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.model == "  Claude-Sonnet-5.5 "


def test_x_api_key_header_works_too(gateway: Gateway, key: str) -> None:
    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions", json=simple(), headers={"x-api-key": key}, timeout=30
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == "chatcmpl-" + resp.headers["request-id"]
    # "Accepted on every /v1 and /openai/v1 endpoint", both header styles.
    for path in ("/openai/v1/models", f"/openai/v1/models/{MODEL}", "/v1/models"):
        for headers in ({"x-api-key": key}, {"authorization": f"Bearer {key}"}):
            assert requests.get(gateway.url + path, headers=headers, timeout=10).status_code == 200, (path, headers)
        assert requests.get(gateway.url + path, timeout=10).status_code == 401


def test_models_list_and_retrieve(gateway: Gateway, key: str) -> None:
    c = client(gateway, key)
    ids = [m.id for m in c.models.list()]
    assert ids == [MODEL, "anthropic/claude-haiku-4-5", "anthropic/claude-thinker"]
    resp = requests.get(
        f"{gateway.url}/openai/v1/models/{MODEL}", headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    assert resp.json() == {"id": MODEL, "object": "model", "created": resp.json()["created"], "owned_by": "anthropic"}
    assert c.models.retrieve("claude-haiku-4-5").id == "anthropic/claude-haiku-4-5"
    missing = requests.get(
        f"{gateway.url}/openai/v1/models/gpt-9", headers={"authorization": f"Bearer {key}"}, timeout=10
    )
    assert_envelope(missing, 404, "invalid_request_error", "model_not_found", param="model")


def test_public_catalog(gateway: Gateway) -> None:
    data = requests.get(gateway.url + "/api/models", timeout=10).json()["data"]
    by_id = {m["id"]: m for m in data}
    assert by_id[MODEL]["capabilities"]["sampling"] is False
    assert by_id["anthropic/claude-haiku-4-5"]["capabilities"]["sampling"] is True
    assert by_id["anthropic/claude-thinker"]["capabilities"]["forcedToolChoice"] is False
    assert by_id[MODEL]["maxOutputTokens"] == 64000 and by_id[MODEL]["aliases"] == [
        "claude-sonnet-5-5",
        "claude-sonnet-5.5",
    ]


def test_healthz_needs_no_key(gateway: Gateway) -> None:
    resp = requests.get(gateway.url + "/healthz", timeout=10)
    assert resp.status_code == 200 and resp.headers["request-id"]


# ---------------------------------------------------------------- errors


def test_unknown_model_exact_envelope(gateway: Gateway, key: str) -> None:
    assert_envelope(
        post(gateway, simple("gpt-9"), key),
        404,
        "invalid_request_error",
        "model_not_found",
        "The model `gpt-9` does not exist or you do not have access to it.",
        "model",
    )


def test_invalid_json(gateway: Gateway, key: str) -> None:
    error = assert_envelope(post(gateway, b'{"model": ', key), 400, "invalid_request_error", None)
    assert "not valid JSON" in error["message"]


def test_body_over_the_limit_is_refused_before_it_is_read(gateway: Gateway, key: str) -> None:
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (33 * 1024 * 1024) + b'"}]}'
    assert_envelope(post(gateway, big, key), 413, "invalid_request_error", "request_too_large")

    def chunks() -> Any:  # no content-length: the cap still holds while reading
        yield big[:1024]
        for i in range(1024, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    resp = requests.post(
        gateway.url + "/openai/v1/chat/completions",
        data=chunks(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=60,
    )
    assert_envelope(resp, 413, "invalid_request_error", "request_too_large")


def test_unknown_route_and_method_in_the_right_dialect(gateway: Gateway, key: str) -> None:
    assert_envelope(requests.get(gateway.url + "/openai/v1/nope", timeout=10), 404, "invalid_request_error", None)
    assert_envelope(
        requests.get(gateway.url + "/openai/v1/chat/completions", timeout=10), 405, "invalid_request_error", None
    )
    native = requests.get(gateway.url + "/v1/nope", timeout=10)
    assert native.status_code == 404 and native.json()["type"] == "error"
    assert native.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "headers, message_part",
    [
        ({}, "Missing API key"),
        ({"authorization": "Bearer ezat_sk_not_a_real_key"}, "Invalid API key"),
        ({"x-api-key": "nope"}, "Invalid API key"),
        ({"authorization": "Basic abc"}, "Missing API key"),
    ],
    ids=["missing", "unknown-bearer", "unknown-x-api-key", "wrong-scheme"],
)
def test_bad_keys_get_401(gateway: Gateway, headers: dict[str, str], message_part: str) -> None:
    error = assert_envelope(post(gateway, simple(), headers=headers), 401, "invalid_request_error", "invalid_api_key")
    assert message_part in error["message"]


def test_revoked_and_expired_keys_get_401(gateway: Gateway) -> None:
    revoked = gateway.new_key("acme")
    key_id = json.loads(gateway.cli("keys", "list", "--json").stdout)[-1]["id"]
    assert post(gateway, simple(), revoked).status_code == 200
    gateway.cli("keys", "revoke", key_id)
    assert_envelope(post(gateway, simple(), revoked), 401, "invalid_request_error", "invalid_api_key")
    expiring = gateway.new_key("acme", "--expires", (datetime.now(UTC) + timedelta(days=1)).isoformat())
    assert post(gateway, simple(), expiring).status_code == 200  # an expiry to come doesn't refuse a key
    # The day passes: the key's expiry is moved a minute into the past in the gateway's database
    # (the store never caches a key), so no wall-clock race with the CLI's start on a loaded
    # machine decides the outcome.
    _expire_key_now(gateway, expiring)
    error = assert_envelope(post(gateway, simple(), expiring), 401, "invalid_request_error", "invalid_api_key")
    assert "expired" in error["message"]


def _expire_key_now(gateway: Gateway, secret: str) -> None:
    """Set the expiry of the key ``secret`` to a minute ago, in the database the gateway uses."""
    keys = json.loads(gateway.cli("keys", "list", "--json").stdout)
    (key_id,) = [k["id"] for k in keys if secret.startswith(k["prefix"])]
    engine = make_engine(load_config(gateway.config_path, environ={}).gateway.database_url)
    try:
        with engine.begin() as conn:
            moved = conn.execute(
                update(api_keys)
                .where(api_keys.c.public_id == key_id)
                .values(expires_at=datetime.now(UTC) - timedelta(minutes=1))
            )
            assert moved.rowcount == 1
    finally:
        engine.dispose()


def test_suspended_org_and_model_patterns_get_403(gateway: Gateway) -> None:
    limited = gateway.new_key("patterns-org", "--models", "anthropic/claude-haiku-*")
    assert post(gateway, simple("claude-haiku-4-5"), limited).status_code == 200
    assert_envelope(post(gateway, simple(MODEL), limited), 403, "permission_error", None)
    suspended = gateway.new_key("suspended-org")
    gateway.cli("orgs", "suspend", "suspended-org")
    assert_envelope(post(gateway, simple(), suspended), 403, "permission_error", None)
    gateway.cli("orgs", "resume", "suspended-org")
    assert post(gateway, simple(), suspended).status_code == 200


@pytest.fixture(scope="module")
def no_cooldown_gateway(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway whose deployment never cools down, so each upstream status is seen as it is."""
    from tests.integration.conftest import standard_models

    server = Gateway(
        root=tmp_path_factory.mktemp("no-cooldown"),
        models=standard_models(sim.url),
        gateway_settings={"cooldown_failures": 100000, "max_cooldown_s": 0},
    ).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "marker, status, type_, code",
    [
        ("[[sim:status=529,retry_after=7]]", 503, "server_error", "overloaded"),
        ("[[sim:status=429,retry_after=3]]", 429, "rate_limit_error", "rate_limit_exceeded"),
        ("[[sim:status=500]]", 500, "server_error", None),
        ("[[sim:status=503,retry_after=2]]", 503, "server_error", "overloaded"),
        ("[[sim:status=504]]", 504, "server_error", "timeout"),
        ("[[sim:status=413]]", 413, "invalid_request_error", "request_too_large"),
    ],
    ids=["529", "429", "500", "503", "504", "413"],
)
def test_upstream_statuses_mapped_by_the_table(
    no_cooldown_gateway: Gateway, marker: str, status: int, type_: str, code: str | None
) -> None:
    gateway = no_cooldown_gateway
    resp = post(gateway, simple(text=f"hello {marker}"), gateway.new_key("mapping-org"))
    assert_envelope(resp, status, type_, code)
    if "retry_after" in marker:
        assert resp.headers["retry-after"] == marker.split("retry_after=")[1].split("]")[0]


ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_upstream_400_is_the_clients_fault_with_paths_into_its_request(gateway: Gateway, key: str) -> None:
    body = simple()
    body["messages"] = [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "x [[sim:reject=messages.0.content.1.image.source]]"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + ONE_PIXEL_PNG}},
            ],
        },
    ]
    error = assert_envelope(post(gateway, body, key), 400, "invalid_request_error", None)
    # The upstream names messages.0.content.1 (system removed); the client gets its own path.
    assert error == {
        "message": "messages[1].content[1]: rejected by the simulator",
        "type": "invalid_request_error",
        "param": "messages[1].content[1]",
        "code": None,
    }


def test_deployment_credentials_refused_is_not_the_clients_401(tmp_path: Any) -> None:
    locked = Sim(name="locked", flags=("--api-key", "the-right-key")).start()
    from tests.integration.harness import ModelSpec

    gw = Gateway(root=tmp_path, models=[ModelSpec(deployments=[{"name": "locked", "base_url": locked.url}])])
    try:
        gw.start()
        resp = post(gw, simple(), gw.new_key())
        error = assert_envelope(resp, 500, "server_error", None)
        assert "gateway" in error["message"]
    finally:
        gw.stop()
        locked.stop()


def test_usage_cli_shows_what_the_client_received(gateway: Gateway) -> None:
    key = gateway.new_key("usage-org")
    completion = client(gateway, key).chat.completions.create(**simple())
    (row,) = gateway.usage("--org", "usage-org")
    assert row["request_id"] == completion.id.removeprefix("chatcmpl-")
    assert completion.usage is not None
    assert row["input_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"] == completion.usage.prompt_tokens
    assert row["output_tokens"] == completion.usage.completion_tokens
    assert row["model"] == MODEL and row["canonical_model"] == MODEL and row["status"] == 200
    assert row["endpoint"] == "chat.completions" and row["deployment"] == "sim-a" and row["estimated"] is False
    assert set(row) == {
        "request_id",
        "created_at",
        "org",
        "key_id",
        "endpoint",
        "model",
        "canonical_model",
        "deployment",
        "input_tokens",
        "cache_write_tokens",
        "cache_read_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cost_usd",
        "status",
        "estimated",
    }
    table = gateway.cli("usage", "--org", "usage-org").stdout
    assert "usage-org" in table and row["cost_usd"] in table
