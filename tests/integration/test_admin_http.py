"""The admin API through the real app on a real SQLite database (Flask's test client; gunicorn and
the ``anthropic`` SDK are test_admin_sdk.py's): which listener serves it, who may call it, its
error envelope, the wire shapes of workspaces, api_keys, rate limits and the audit trail, its
OpenAPI document, and a blocked or rotated key as the inference routes see it at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ezat_compat.admin import service
from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.domain import Config
from ezat_compat.store.db import migrate

pytestmark = pytest.mark.integration

ADMIN = "/v1/organizations"
MAIN_PORT, ADMIN_PORT = 8080, 8081


class FakeSocket:
    """What gunicorn puts in ``environ["gunicorn.socket"]``: the listener's address is asked of it."""

    def __init__(self, port: int) -> None:
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


ON_MAIN = {"gunicorn.socket": FakeSocket(MAIN_PORT)}
ON_ADMIN = {"gunicorn.socket": FakeSocket(ADMIN_PORT)}


def _config(root: Path, **admin: Any) -> Config:
    models = [
        {
            "id": "anthropic/claude-sonnet-5-5",
            "aliases": ["claude-sonnet-5-5", "claude-sonnet-*"],
            "price": {"input": 3, "output": 15},
            "deployments": [{"name": "nowhere", "base_url": "http://127.0.0.1:9", "upstream_model": "m"}],
        }
    ]
    data = {
        "gateway": {"database_url": f"sqlite:///{root / 'ezat.db'}", "data_dir": str(root)},
        "server": {"bind": f"127.0.0.1:{MAIN_PORT}"},
        "admin": {"bind": f"127.0.0.1:{ADMIN_PORT}", **admin},
        "models": models,
    }
    return parse_config(data, path=str(root / "ezat.toml"), environ={})


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    config = _config(tmp_path)
    migrate(config.gateway.database_url)
    app = create_app(config)
    yield app
    app.extensions["ezat_store"].close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def admin_key(app: Flask) -> str:
    return service.create_admin_key(app.extensions["ezat_store"], service.cli_context(), name="t")[1]


@pytest.fixture
def read_only_key(app: Flask) -> str:
    store = app.extensions["ezat_store"]
    return service.create_admin_key(store, service.cli_context(), read_only=True)[1]


def _call(client: FlaskClient, method: str, path: str, key: str | None, **kwargs: Any) -> Any:
    headers = {"x-api-key": key} if key else {}
    return client.open(ADMIN + path, method=method, headers=headers, environ_overrides=ON_ADMIN, **kwargs)


# ---------------------------------------------------------------- listeners


def test_the_admin_listener_serves_the_admin_api_and_healthz_only(client: FlaskClient, admin_key: str) -> None:
    headers = {"x-api-key": admin_key}
    assert client.get(ADMIN + "/me", headers=headers, environ_overrides=ON_ADMIN).status_code == 200
    assert client.get("/healthz", environ_overrides=ON_ADMIN).status_code == 200
    for path in ("/v1/models", "/openai/v1/models", "/readyz", "/metrics", "/api/models"):
        assert client.get(path, environ_overrides=ON_ADMIN).status_code == 404, path
    refused = client.post("/v1/messages", json={}, environ_overrides=ON_ADMIN)
    assert refused.status_code == 404 and refused.json["type"] == "error"


def test_the_main_listener_does_not_serve_the_admin_api_unless_told(tmp_path: Path, admin_key: str) -> None:
    del admin_key
    for on_main_listener, status in ((False, 404), (True, 401)):
        root = tmp_path / str(on_main_listener)
        root.mkdir()
        config = _config(root, on_main_listener=on_main_listener)
        migrate(config.gateway.database_url)
        app = create_app(config)
        try:
            answer = app.test_client().get(ADMIN + "/me", environ_overrides=ON_MAIN)
            assert answer.status_code == status
            assert answer.json["type"] == "error" and answer.headers["request-id"]
        finally:
            app.extensions["ezat_store"].close()


def test_without_a_listener_or_the_main_one_there_is_no_admin_api(tmp_path: Path) -> None:
    config = _config(tmp_path, bind="")
    migrate(config.gateway.database_url)
    app = create_app(config)
    try:
        client = app.test_client()
        assert client.get(ADMIN + "/me", environ_overrides=ON_MAIN).status_code == 404
        assert client.get(ADMIN + "/openapi.json", environ_overrides=ON_MAIN).status_code == 404
        assert client.get("/api/models", environ_overrides=ON_MAIN).status_code == 200
    finally:
        app.extensions["ezat_store"].close()


# ---------------------------------------------------------------- who may call


def test_an_inference_key_is_refused_in_anthropics_envelope(client: FlaskClient, app: Flask) -> None:
    store = app.extensions["ezat_store"]
    org = service.create_org(store, service.cli_context(), "acme")
    _, inference = service.create_key(store, service.cli_context(), org.name)
    for headers in ({"x-api-key": inference}, {"authorization": f"Bearer {inference}"}):
        answer = client.get(ADMIN + "/workspaces", headers=headers, environ_overrides=ON_ADMIN)
        assert answer.status_code == 403 and answer.headers["x-should-retry"] == "false"
        body = answer.json
        assert body["type"] == "error" and body["error"]["type"] == "permission_error"
        assert body["request_id"] == answer.headers["request-id"]
    for key, status in ((None, 401), ("ezat_admin_" + "x" * 32, 401), ("sk-ant-admin01-x", 401)):
        answer = _call(client, "GET", "/workspaces", key)
        assert (answer.status_code, answer.json["error"]["type"]) == (status, "authentication_error")


def test_a_read_only_key_reads_but_cannot_change(client: FlaskClient, read_only_key: str) -> None:
    assert _call(client, "GET", "/workspaces", read_only_key).status_code == 200
    refused = _call(client, "POST", "/workspaces", read_only_key, json={"name": "acme"})
    assert refused.status_code == 403 and "read-only" in refused.json["error"]["message"]
    assert _call(client, "GET", "/workspaces", read_only_key).json["data"] == []


def test_a_revoked_admin_key_is_refused_from_its_next_request(client: FlaskClient, app: Flask) -> None:
    store = app.extensions["ezat_store"]
    info, secret = service.create_admin_key(store, service.cli_context())
    assert _call(client, "GET", "/me", secret).status_code == 200
    service.revoke_admin_key(store, service.cli_context(), info.id)
    answer = _call(client, "GET", "/me", secret)
    assert answer.status_code == 401 and "revoked" in answer.json["error"]["message"]


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("GET", "/nowhere", None, 404, "Not found"),
        ("DELETE", "/workspaces", None, 405, "use GET, POST"),
        ("POST", "/workspaces", {"nom": "x"}, 400, "name: Missing data for required field.; nom: Unknown field."),
        ("POST", "/workspaces", {"name": "has space"}, 400, "not a valid organization name"),
        ("POST", "/workspaces", {"name": "acme", "tags": {"team": "a"}}, 400, "tags: not supported"),
        ("POST", "/workspaces", {"name": "acme", "balance": 5}, 400, "balance: Not a valid string."),
        ("GET", "/workspaces?limit=0", None, 400, "limit"),
        ("GET", "/workspaces?after_id=wrkspc_nope", None, 400, "after_id"),
        ("GET", "/workspaces/wrkspc_nope", None, 404, "wrkspc_nope"),
        ("GET", "/api_keys/apikey_000000000000", None, 404, "apikey_000000000000"),
        ("GET", "/api_keys?status=gone", None, 400, "status"),
        ("GET", "/audit_log?since=yesterday", None, 400, "since"),
        ("GET", "/audit_log?page=nope", None, 400, "page"),
        ("GET", "/rate_limits?model=gpt-9", None, 404, "gpt-9"),
    ],
)
def test_mistakes_are_answered_in_anthropics_envelope(
    client: FlaskClient, admin_key: str, method: str, path: str, body: Any, status: int, words: str
) -> None:
    answer = _call(client, method, path, admin_key, json=body)
    assert answer.status_code == status, answer.json
    assert answer.json["type"] == "error" and words in answer.json["error"]["message"]
    assert answer.headers["content-type"].startswith("application/json")


# ---------------------------------------------------------------- workspaces


def test_workspaces_in_the_admin_apis_shape_with_our_extensions(client: FlaskClient, admin_key: str) -> None:
    made = _call(client, "POST", "/workspaces", admin_key, json={"name": "acme", "balance": "1250.5", "models": ["*"]})
    assert made.status_code == 200
    ws = made.json
    assert ws["id"].startswith("wrkspc_01") and ws["type"] == "workspace" and ws["name"] == "acme"
    assert ws["created_at"].endswith("Z") and ws["archived_at"] is None
    assert ws["data_residency"]["workspace_geo"] == "us" and ws["tags"] == {}
    assert ws["balance"] == {"amount": "1250.5", "reserved": "0", "available": "1250.5", "currency": "USD"}
    assert ws["models"] == ["*"]
    assert _call(client, "GET", f"/workspaces/{ws['id']}", admin_key).json == ws
    assert _call(client, "GET", "/workspaces/acme", admin_key).json["id"] == ws["id"]  # the name too
    renamed = _call(client, "POST", f"/workspaces/{ws['id']}", admin_key, json={"name": "acme-2"}).json
    assert (renamed["id"], renamed["name"]) == (ws["id"], "acme-2")
    topped = _call(client, "POST", f"/workspaces/{ws['id']}/top_up", admin_key, json={"amount": "0.0001"}).json
    assert topped["balance"]["amount"] == "1250.5001"
    assert _call(client, "POST", f"/workspaces/{ws['id']}/top_up", admin_key, json={"amount": "0"}).status_code == 400
    archived = _call(client, "POST", f"/workspaces/{ws['id']}/archive", admin_key)  # no body, as the SDK sends it
    assert archived.status_code == 200 and archived.json["archived_at"].endswith("Z")
    assert _call(client, "GET", "/workspaces", admin_key).json["data"] == []
    listed = _call(client, "GET", "/workspaces?include_archived=true", admin_key).json
    assert [w["id"] for w in listed["data"]] == [ws["id"]]
    back = _call(client, "POST", f"/workspaces/{ws['id']}/unarchive", admin_key, content_type="application/json")
    assert back.json["archived_at"] is None


def test_workspaces_page_as_the_sdk_walks_them(client: FlaskClient, admin_key: str) -> None:
    ids = [_call(client, "POST", "/workspaces", admin_key, json={"name": f"org{n}"}).json["id"] for n in range(5)]
    seen, query = [], "limit=2"
    while True:
        page = _call(client, "GET", f"/workspaces?{query}", admin_key).json
        seen += [w["id"] for w in page["data"]]
        if not page["has_more"]:
            break
        query = f"limit=2&after_id={page['last_id']}"
    assert seen == ids
    picked = _call(client, "GET", f"/workspaces?ids[]={ids[3]}&ids[]={ids[1]}", admin_key).json
    assert [w["id"] for w in picked["data"]] == [ids[1], ids[3]]


# ---------------------------------------------------------------- api keys


def _key(client: FlaskClient, admin_key: str, **body: Any) -> dict[str, Any]:
    answer = _call(client, "POST", "/api_keys", admin_key, json={"workspace_id": "acme", **body})
    assert answer.status_code == 200, answer.json
    return dict(answer.json)


def test_api_keys_in_the_admin_apis_shape_with_our_extensions(client: FlaskClient, admin_key: str) -> None:
    ws = _call(client, "POST", "/workspaces", admin_key, json={"name": "acme"}).json
    made = _key(client, admin_key, name="ci", models=["claude-sonnet-*"], rate_limits={"requests_per_minute": 5})
    secret = made.pop("secret")
    assert secret.startswith("ezat_sk_") and made["partial_key_hint"] == secret[:12] + "…"
    assert made["id"].startswith("apikey_") and made["type"] == "api_key" and made["status"] == "active"
    assert made["scope"] == {"type": "workspace", "workspace_id": ws["id"]}
    assert made["created_by"]["type"] == "service_account" and made["created_by"]["id"].startswith("adminkey_")
    assert made["rate_limits"] == {"requests_per_minute": 5, "tokens_per_minute": None}
    fetched = _call(client, "GET", f"/api_keys/{made['id']}", admin_key).json
    assert fetched == made and "secret" not in fetched
    legacy_id = "key_" + made["id"].removeprefix("apikey_")
    assert _call(client, "GET", f"/api_keys/{legacy_id}", admin_key).json["id"] == made["id"]
    changed = _call(
        client,
        "POST",
        f"/api_keys/{made['id']}",
        admin_key,
        json={"name": "ci-2", "expires_at": "2031-01-01T00:00:00+00:00", "rate_limits": {"tokens_per_minute": 100}},
    ).json
    assert (changed["name"], changed["expires_at"]) == ("ci-2", "2031-01-01T00:00:00Z")
    assert changed["rate_limits"] == {"requests_per_minute": 5, "tokens_per_minute": 100}
    past = _call(client, "POST", f"/api_keys/{made['id']}", admin_key, json={"expires_at": "2001-01-01T00:00:00Z"})
    assert past.status_code == 400 and "past" in past.json["error"]["message"]


def test_api_keys_are_listed_by_status_and_workspace(client: FlaskClient, admin_key: str) -> None:
    for name in ("acme", "beta"):
        _call(client, "POST", "/workspaces", admin_key, json={"name": name})
    first, second = _key(client, admin_key), _key(client, admin_key)
    other = _key(client, admin_key, workspace_id="beta")
    _call(client, "POST", f"/api_keys/{second['id']}", admin_key, json={"status": "inactive"})
    _call(client, "POST", f"/api_keys/{other['id']}", admin_key, json={"status": "archived"})

    def listed(query: str) -> list[str]:
        return [k["id"] for k in _call(client, "GET", f"/api_keys?{query}", admin_key).json["data"]]

    assert listed("") == [first["id"], second["id"], other["id"]]
    assert listed("status=active") == [first["id"]]
    assert listed("status=inactive") == [second["id"]]
    assert listed("status=archived") == [other["id"]]
    assert listed("workspace_id=acme") == [first["id"], second["id"]]
    assert listed(f"limit=1&after_id={first['id']}") == [second["id"]]
    conflict = _call(client, "POST", f"/api_keys/{other['id']}", admin_key, json={"status": "active"})
    assert conflict.status_code == 409 and conflict.json["error"]["type"] == "conflict_error"


def test_a_blocked_or_rotated_key_is_seen_by_the_inference_routes_at_once(client: FlaskClient, admin_key: str) -> None:
    _call(client, "POST", "/workspaces", admin_key, json={"name": "acme"})
    made = _key(client, admin_key)
    secret = made["secret"]

    def messages(key: str) -> Any:
        return client.post("/v1/messages", json={}, headers={"x-api-key": key}, environ_overrides=ON_MAIN)

    assert messages(secret).status_code == 400  # past authentication: the empty body is refused
    _call(client, "POST", f"/api_keys/{made['id']}", admin_key, json={"status": "inactive"})
    blocked = messages(secret)
    assert blocked.status_code == 401 and "disabled" in blocked.json["error"]["message"]
    _call(client, "POST", f"/api_keys/{made['id']}", admin_key, json={"status": "active"})
    assert messages(secret).status_code == 400
    rotated = _call(client, "POST", f"/api_keys/{made['id']}/rotate", admin_key, json={"grace_seconds": 0}).json
    assert messages(secret).status_code == 401 and messages(rotated["secret"]).status_code == 400
    again = _call(client, "POST", f"/api_keys/{made['id']}/rotate", admin_key, json={"grace_seconds": 3600}).json
    assert messages(rotated["secret"]).status_code == 400 and messages(again["secret"]).status_code == 400
    assert (
        _call(client, "POST", f"/api_keys/{made['id']}/rotate", admin_key, json={"grace_seconds": -1}).status_code
        == 400
    )


# ---------------------------------------------------------------- rate limits


def test_rate_limits_map_onto_each_keys_caps(client: FlaskClient, admin_key: str) -> None:
    org = _call(client, "GET", "/rate_limits", admin_key).json
    (entry,) = org["data"]
    assert org["next_page"] is None and entry["type"] == "rate_limit" and entry["limits"] == []
    assert entry["group"]["type"] == "model_group" and "anthropic/claude-sonnet-5-5" in entry["models"]
    assert _call(client, "GET", "/rate_limits?model=claude-sonnet-5.5", admin_key).status_code == 200  # an alias
    assert _call(client, "GET", "/rate_limits?group_type=batch", admin_key).json["data"] == []
    ws = _call(client, "POST", "/workspaces", admin_key, json={"name": "acme"}).json
    assert _call(client, "GET", f"/workspaces/{ws['id']}/rate_limits", admin_key).json["data"] == []
    path = f"/workspaces/{ws['id']}/rate_limits/{entry['id']}"
    body = {"limits": [{"type": "requests_per_minute", "value": 30}, {"type": "tokens_per_minute", "value": None}]}
    updated = _call(client, "POST", path, admin_key, json=body).json
    assert updated["type"] == "workspace_rate_limit" and updated["workspace_id"] == ws["id"]
    assert updated["limits"] == [
        {"type": "requests_per_minute", "value": 30, "org_limit": None, "source": {"type": "workspace"}}
    ]
    assert _call(client, "GET", f"/workspaces/{ws['id']}/rate_limits", admin_key).json["data"] == [updated]
    made = _key(client, admin_key, rate_limits={"requests_per_minute": 100})
    assert made["rate_limits"]["requests_per_minute"] == 100  # the key's own; the workspace's 30 applies
    unknown = _call(client, "POST", path, admin_key, json={"limits": [{"type": "tokens_per_day", "value": 5}]})
    assert unknown.status_code == 400 and "tokens_per_day" in unknown.json["error"]["message"]
    missing = _call(client, "POST", f"/workspaces/{ws['id']}/rate_limits/rl_other", admin_key, json=body)
    assert missing.status_code == 404


# ---------------------------------------------------------------- the audit trail and the document


def test_the_audit_log_pages_newest_first_and_filters(client: FlaskClient, admin_key: str, app: Flask) -> None:
    for n in range(3):
        _call(client, "POST", "/workspaces", admin_key, json={"name": f"org{n}"})
    service.create_org(app.extensions["ezat_store"], dataclasses.replace(service.cli_context(), actor="cli:ops"), "x")
    first = _call(client, "GET", "/audit_log?limit=3", admin_key).json
    assert first["has_more"] is True and first["next_page"]
    assert [e["after"]["name"] for e in first["data"]] == ["x", "org2", "org1"]
    entry = first["data"][1]
    assert entry["actor"].startswith("adminkey_") and entry["action"] == "workspace.create"
    assert entry["request_id"] and entry["address"] == "127.0.0.1" and entry["at"].endswith("Z")
    rest = _call(client, "GET", f"/audit_log?limit=3&page={first['next_page']}", admin_key).json
    names = [e["after"]["name"] for e in rest["data"] if e["action"] == "workspace.create"]
    assert names == ["org0"] and rest["has_more"] is False and rest["next_page"] is None
    mine = _call(client, "GET", "/audit_log?actor=cli:ops", admin_key).json["data"]
    assert [e["after"]["name"] for e in mine] == ["x"]


def test_the_openapi_document_describes_the_admin_api(client: FlaskClient) -> None:
    answer = client.get(ADMIN + "/openapi.json", environ_overrides=ON_ADMIN)
    assert answer.status_code == 200
    spec = answer.json
    assert spec["openapi"].startswith("3.") and spec["info"]["title"] == "ezat-compat admin API"
    for path in ("/workspaces", "/workspaces/{workspace_id}/archive", "/api_keys/{api_key_id}", "/audit_log", "/me"):
        assert ADMIN + path in spec["paths"], path
    assert "x-api-key" in str(spec["components"]["securitySchemes"])
