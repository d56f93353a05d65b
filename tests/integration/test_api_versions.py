"""API versions and Foundry's hosting through the real gateway (gunicorn, gevent) and simulators
that hold each version's rules (``sim/validate.py``: under 2026-10-21, ``temperature`` is a 400).

Each deployment speaks its configured ``anthropic-version``. A request of every dialect (Chat
Completions, Responses, legacy completions, ``/v1/messages`` sent with 2023-06-01 and with
2026-10-21) goes first to a deployment that is down (the simulator answers 529 to everything it
takes, after checking the request as the API would, so a field its version refuses is a 400
there, which no failover would hide) and fails over to one of the other version, on Anthropic's
API, Foundry and Bedrock: every answer is a 200 served by the second deployment, and each
upstream got the request shaped for its own version (``temperature`` dropped under 2026-10-21,
the spec's "dropped" rule). A Foundry deployment hosted on Azure never receives structured
outputs or a server tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat.sim.clouds import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY
from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.clouds import bedrock_at
from tests.support.entra import CLIENT_ID, CLIENT_SECRET, TENANT, EntraEndpoint

pytestmark = pytest.mark.integration

V2023, V2026 = "2023-06-01", "2026-10-21"
FOUNDRY_KEY = "foundry-test-key"


def _model(alias: str, *deployments: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id=f"anthropic/{alias}", aliases=(alias,), deployments=deployments, sampling=True)


def _anthropic(name: str, sim: Sim, version: str, priority: int) -> dict[str, Any]:
    return {"name": name, "base_url": sim.url, "anthropic_version": version, "priority": priority}


def _foundry(name: str, sim: Sim, version: str, priority: int, hosting: str = "anthropic") -> dict[str, Any]:
    path = "/azure/anthropic" if hosting == "azure" else "/anthropic"
    return {
        "name": name,
        "provider": "foundry",
        "base_url": sim.url + path,
        "api_key_env": "FOUNDRY_KEY",
        "hosting": hosting,
        "anthropic_version": version,
        "priority": priority,
    }


# alias -> (the deployment that is down, the one that serves); a name ending in 2026 speaks
# 2026-10-21, every other 2023-06-01 (Bedrock's InvokeModel included)
FAILOVERS = {
    "new-then-old": ("down-2026", "up-2023"),
    "old-then-new": ("down-2023", "up-2026"),
    "foundry-new-then-bedrock": ("foundry-down-2026", "bedrock-up"),
    "bedrock-then-foundry-new": ("bedrock-down", "foundry-up-2026"),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim, Sim, str]]:
    root = tmp_path_factory.mktemp("versions")
    down = Sim(name="down", flags=("--fail-status", "529")).start()
    up = Sim(name="up").start()
    (root / "aws-config").write_text("")
    models = [
        _model("new-then-old", _anthropic("down-2026", down, V2026, 0), _anthropic("up-2023", up, V2023, 1)),
        _model("old-then-new", _anthropic("down-2023", down, V2023, 0), _anthropic("up-2026", up, V2026, 1)),
        _model(
            "foundry-new-then-bedrock",
            _foundry("foundry-down-2026", down, V2026, 0),
            {"name": "bedrock-up", **bedrock_at(up.url), "priority": 1},
        ),
        _model(
            "bedrock-then-foundry-new",
            {"name": "bedrock-down", **bedrock_at(down.url), "priority": 0},
            _foundry("foundry-up-2026", up, V2026, 1),
        ),
        _model("only-new", _anthropic("only-2026", up, V2026, 0)),
        _model("azure-then-anthropic", _foundry("azure", up, V2023, 0, "azure"), _anthropic("plain", up, V2023, 1)),
        _model("azure-only", _foundry("azure-alone", up, V2023, 0, "azure")),
    ]
    env = {
        "AWS_ACCESS_KEY_ID": SIM_AWS_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SIM_AWS_SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(root / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(root / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "FOUNDRY_KEY": FOUNDRY_KEY,
        "ANTHROPIC_API_KEY": "sk-ant-test",
    }
    settings = {"cooldown_failures": 1000}  # the down deployment is tried by every request
    gw = Gateway(root=root / "gw", models=models, env=env, gateway_settings=settings).start()
    try:
        yield gw, down, up, gw.new_key("versions", balance="100")
    finally:
        gw.stop()
        down.stop()
        up.stop()


def _send(gw: Gateway, key: str, dialect: str, alias: str, client_version: str = V2023) -> requests.Response:
    """One request of ``dialect`` with ``temperature`` (a 2026-10-21 native client sends none)."""
    auth = {"authorization": f"Bearer {key}"}
    if dialect == "chat":
        body: dict[str, Any] = {"model": alias, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.3}
        return requests.post(gw.url + "/openai/v1/chat/completions", json=body, headers=auth, timeout=30)
    if dialect == "responses":
        body = {"model": alias, "input": "Hi", "temperature": 0.3}
        return requests.post(gw.url + "/openai/v1/responses", json=body, headers=auth, timeout=30)
    if dialect == "completions":
        body = {"model": alias, "prompt": "Say hi", "max_tokens": 16, "temperature": 0.3}
        return requests.post(gw.url + "/openai/v1/completions", json=body, headers=auth, timeout=30)
    body = {"model": alias, "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]}
    if client_version == V2023:
        body["temperature"] = 0.3
    headers = {"x-api-key": key, "anthropic-version": client_version}
    return requests.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)


CASES = [
    pytest.param(dialect, version, id=f"{dialect}-{version}")
    for dialect, version in (
        ("chat", V2023),
        ("responses", V2023),
        ("completions", V2023),
        ("messages", V2023),
        ("messages", V2026),
    )
]


@pytest.mark.parametrize(("dialect", "client_version"), CASES)
@pytest.mark.parametrize("alias", list(FAILOVERS))
def test_each_dialect_fails_over_across_versions_with_no_400(
    stack: tuple[Gateway, Sim, Sim, str], alias: str, dialect: str, client_version: str
) -> None:
    gw, down, up, key = stack
    down.clear()
    up.clear()
    reply = _send(gw, key, dialect, alias, client_version)
    assert reply.status_code == 200, reply.text
    failed, served = FAILOVERS[alias]
    (tried,) = down.requests()  # the down deployment took the request, checked it, answered 529
    (got,) = up.requests()
    assert got["name"] == "up" and tried["name"] == "down"
    row = next(r for r in gw.usage() if r["request_id"] == reply.headers["request-id"])
    assert (row["deployment"], row["status"]) == (served, 200)
    for sent, name in ((tried, failed), (got, served)):
        speaks = V2026 if name.endswith("2026") else V2023
        if "anthropic-version" in sent["headers"]:  # Anthropic's API and Foundry: the deployment's own
            assert sent["headers"]["anthropic-version"] == speaks
        assert ("temperature" in sent["body"]) is (
            speaks == V2023 and (dialect != "messages" or client_version == V2023)
        )


def test_a_stream_fails_over_from_a_2026_deployment_with_temperature_dropped(
    stack: tuple[Gateway, Sim, Sim, str],
) -> None:
    gw, down, up, key = stack
    down.clear()
    up.clear()
    body = {
        "model": "old-then-new",
        "stream": True,
        "temperature": 0.7,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    with requests.post(
        gw.url + "/openai/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=30,
    ) as reply:
        text = reply.text
    assert reply.status_code == 200 and "data: [DONE]" in text
    assert down.bodies()[0]["temperature"] == 0.7 and "temperature" not in up.bodies()[0]


def test_a_field_a_2026_deployment_refuses_passes_it_over_or_is_a_400_naming_it(
    stack: tuple[Gateway, Sim, Sim, str],
) -> None:
    gw, down, up, key = stack
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."}}
    messages = [
        {"role": "user", "content": "Read this"},
        {"role": "assistant", "content": [document, {"type": "text", "text": "Read."}]},
        {"role": "user", "content": "What colour?"},
    ]
    headers = {"x-api-key": key, "anthropic-version": V2023}
    down.clear()
    up.clear()
    served = requests.post(
        gw.url + "/v1/messages",
        json={"model": "new-then-old", "max_tokens": 32, "messages": messages},
        headers=headers,
        timeout=30,
    )
    assert served.status_code == 200, served.text
    assert down.requests() == [] and len(up.requests()) == 1  # the 2026-10-21 deployment was passed over
    refused = requests.post(
        gw.url + "/v1/messages",
        json={"model": "only-new", "max_tokens": 32, "messages": messages},
        headers=headers,
        timeout=30,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.1.content.0: not accepted under anthropic-version 2026-10-21")
    assert len(up.requests()) == 1  # sent nowhere


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
AZURE_REFUSED = [
    pytest.param(
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}},
        "output_config.format",
        id="json-schema",
    ),
    pytest.param("messages", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                 "web_search_20250305", id="web-search"),
    pytest.param("messages", {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
                 "code_execution_20250825", id="code-execution"),
]  # fmt: skip


@pytest.mark.parametrize(("dialect", "extra", "kind"), AZURE_REFUSED)
def test_foundry_hosted_on_azure_never_receives_what_it_refuses(
    stack: tuple[Gateway, Sim, Sim, str], dialect: str, extra: dict[str, Any], kind: str
) -> None:
    gw, _, up, key = stack
    for alias in ("azure-then-anthropic", "azure-only"):
        up.clear()
        if dialect == "chat":
            body: dict[str, Any] = {"model": alias, "messages": [{"role": "user", "content": "Where?"}], **extra}
            reply = requests.post(
                gw.url + "/openai/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
        else:
            body = {"model": alias, "max_tokens": 64, "messages": [{"role": "user", "content": "Look it up"}], **extra}
            reply = requests.post(
                gw.url + "/v1/messages", json=body, headers={"x-api-key": key, "anthropic-version": V2023}, timeout=30
            )
        assert not [r for r in up.requests() if r["path"].startswith("/azure/")]
        if alias == "azure-then-anthropic":
            assert reply.status_code == 200, reply.text
            (sent,) = up.requests()
            assert sent["path"] == "/v1/messages"
        else:
            assert reply.status_code == 400
            assert f"can't use {kind}: its deployments are on Foundry hosted on Azure" in reply.text


def test_foundry_hosted_on_azure_serves_what_it_offers(stack: tuple[Gateway, Sim, Sim, str]) -> None:
    gw, _, up, key = stack
    up.clear()
    body = {"model": "azure-only", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]}
    reply = requests.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=30)
    assert reply.status_code == 200, reply.text
    (sent,) = up.requests()
    assert sent["path"] == "/azure/anthropic/v1/messages" and sent["headers"]["x-api-key"] == FOUNDRY_KEY


def test_foundry_with_entra_id_against_a_token_endpoint_on_loopback(tmp_path: Path) -> None:
    """A client secret exchanged at a token endpoint on loopback (https, its certificate trusted
    through the deployment's ``ca_file``); the simulated Foundry takes only that bearer."""
    entra = EntraEndpoint(tmp_path, token="entra-bearer-xyz").start()
    sim = Sim(name="foundry-entra", flags=("--foundry-bearer", "entra-bearer-xyz")).start()
    deployment = {
        "name": "foundry-entra",
        "provider": "foundry",
        "base_url": sim.url + "/anthropic",
        "hosting": "anthropic",
        "auth": "entra_id",
        "tenant_id": TENANT,
        "client_id": CLIENT_ID,
        "client_secret_env": "FOUNDRY_CLIENT_SECRET",
        "authority_host": entra.url,
        "ca_file": entra.ca_file,
    }
    env = {"FOUNDRY_CLIENT_SECRET": CLIENT_SECRET}
    gw = Gateway(root=tmp_path / "gw", models=[_model("entra", deployment)], env=env).start()
    try:
        key = gw.new_key("entra", balance="10")
        for _ in range(2):
            body = {"model": "entra", "messages": [{"role": "user", "content": "Hi"}]}
            reply = requests.post(
                gw.url + "/openai/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
        sent = sim.requests()
        assert [r["headers"]["authorization"] for r in sent] == ["Bearer entra-bearer-xyz"] * 2
        assert all("x-api-key" not in r["headers"] for r in sent)
        assert len(entra.grants) == 1  # the token was cached for the second request
        assert CLIENT_SECRET not in gw.log_text()
    finally:
        gw.stop()
        sim.stop()
        entra.stop()
