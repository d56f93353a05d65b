"""The admin API under gunicorn (two gevent workers), driven by the ``anthropic`` SDK's organization
resources unchanged but for ``base_url`` and an admin key: workspaces created, listed page by page,
renamed and archived; keys listed, blocked (refused at once on the inference route, on every
worker) and unblocked; a key rotated with a grace window (its old secret works until the window
ends, not after); an inference key and a read-only admin key refused in Anthropic's envelope; and
every change with its audit row and log line, no secret in either."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
import requests

from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration

MESSAGE = {"model": "claude-sonnet-5-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
TRIES = 6  # inference requests per check, each on a new connection: both workers answer some


@pytest.fixture(scope="module")
def served(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("admin-gateway")
    # log_level info: the audit lines are INFO records of the ezat_compat.audit logger
    settings = {"log_level": "info"}
    gateway = Gateway(root=root, models=standard_models(sim.url), workers=2, admin=True, server_settings=settings)
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def admin_key(served: Gateway) -> str:
    return served.new_admin_key("--name", "sdk-test")


@pytest.fixture(scope="module")
def client(served: Gateway, admin_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.admin_url, api_key=admin_key)


def _statuses(gateway: Gateway, key: str) -> set[int]:
    """The inference route's answers to ``key``, each request on a connection of its own."""
    statuses = set()
    for _ in range(TRIES):
        with requests.Session() as session:
            answer = session.post(gateway.url + "/v1/messages", json=MESSAGE, headers={"x-api-key": key}, timeout=30)
            statuses.add(answer.status_code)
    return statuses


def _extension(gateway: Gateway, key: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = requests.post(
        gateway.admin_url + "/v1/organizations" + path, json=body, headers={"x-api-key": key}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_workspaces_through_the_sdk(client: anthropic.Anthropic) -> None:
    made = [client.organization.workspaces.create(name=f"team-{n}") for n in range(3)]
    assert all(w.id.startswith("wrkspc_") and w.type == "workspace" for w in made)
    listed = [w.id for w in client.organization.workspaces.list(limit=1)]  # the SDK follows every page
    assert [w.id for w in made] == [i for i in listed if i in {w.id for w in made}]
    renamed = client.organization.workspaces.update(made[0].id, name="team-zero")
    assert (renamed.id, renamed.name) == (made[0].id, "team-zero")
    assert client.organization.workspaces.retrieve(made[0].id).name == "team-zero"
    archived = client.organization.workspaces.archive(made[1].id)
    assert archived.archived_at is not None
    assert made[1].id not in [w.id for w in client.organization.workspaces.list()]
    assert made[1].id in [w.id for w in client.organization.workspaces.list(include_archived=True)]
    me = client.organization.retrieve()
    assert me.type == "organization" and me.id
    (limits,) = list(client.organization.rate_limits.list())
    assert limits.group.type == "model_group"


def test_a_key_blocked_through_the_sdk_is_refused_at_once_and_works_when_unblocked(
    served: Gateway, client: anthropic.Anthropic
) -> None:
    secret = served.new_key("blocking")
    workspace = client.organization.workspaces.retrieve("blocking")
    (key,) = list(client.organization.api_keys.list(workspace_id=workspace.id))
    assert key.status == "active" and secret.startswith(key.partial_key_hint.rstrip("…"))
    assert _statuses(served, secret) == {200}
    blocked = client.organization.api_keys.update(key.id, status="inactive")
    assert blocked.status == "inactive"
    assert _statuses(served, secret) == {401}
    assert [k.id for k in client.organization.api_keys.list(status="inactive")] == [key.id]
    client.organization.api_keys.update(key.id, status="active", name="unblocked")
    assert _statuses(served, secret) == {200}
    assert client.organization.api_keys.retrieve(key.id).name == "unblocked"


def test_a_rotated_key_works_until_its_grace_ends_and_not_after(
    served: Gateway, client: anthropic.Anthropic, admin_key: str
) -> None:
    old = served.new_key("rotating")
    workspace = client.organization.workspaces.retrieve("rotating")
    (key,) = list(client.organization.api_keys.list(workspace_id=workspace.id))
    grace_s = 4
    rotated = _extension(served, admin_key, f"/api_keys/{key.id}/rotate", {"grace_seconds": grace_s})
    ends = time.monotonic() + grace_s
    new = rotated["secret"]
    assert new != old and rotated["id"] == key.id
    assert _statuses(served, old) == {200} and _statuses(served, new) == {200}
    assert time.monotonic() < ends - 0.5, "the checks took most of the grace window; the test would prove nothing"
    time.sleep(max(0.0, ends - time.monotonic()) + 1.0)
    assert _statuses(served, old) == {401}
    assert _statuses(served, new) == {200}


def test_an_inference_key_and_a_read_only_admin_key_are_refused(served: Gateway, client: anthropic.Anthropic) -> None:
    inference = served.new_key("refusals")
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        anthropic.Anthropic(base_url=served.admin_url, api_key=inference).organization.workspaces.list()
    assert caught.value.status_code == 403 and caught.value.type == "permission_error"
    assert caught.value.request_id
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=served.admin_url, api_key="ezat_admin_" + "x" * 32).organization.retrieve()
    reader = anthropic.Anthropic(base_url=served.admin_url, api_key=served.new_admin_key("--read-only"))
    assert reader.organization.workspaces.list().data is not None
    with pytest.raises(anthropic.PermissionDeniedError):
        reader.organization.workspaces.create(name="not-allowed")
    assert "not-allowed" not in [w.name for w in client.organization.workspaces.list()]
    # The main listener doesn't serve the admin API (no [admin] on_main_listener).
    answer = requests.get(served.url + "/v1/organizations/me", headers={"x-api-key": "x"}, timeout=10)
    assert answer.status_code == 404 and answer.json()["type"] == "error"


def test_every_change_has_its_audit_row_and_log_line_without_a_secret(
    served: Gateway, client: anthropic.Anthropic, admin_key: str
) -> None:
    secret = served.new_key("audited")
    workspace = client.organization.workspaces.retrieve("audited")
    (key,) = list(client.organization.api_keys.list(workspace_id=workspace.id))
    client.organization.api_keys.update(key.id, status="inactive")
    rotated = _extension(served, admin_key, f"/api_keys/{key.id}/rotate", {"grace_seconds": 0})["secret"]
    client.organization.workspaces.update(workspace.id, name="audited-2")
    trail = json.loads(served.cli("audit", "list", "--json").stdout)
    mine = [e for e in trail if e["target"]["id"] in (key.id, workspace.id)]
    actions = [(e["actor"].split("_")[0], e["action"]) for e in reversed(mine)]
    assert actions == [
        ("cli:" + actions[0][0].removeprefix("cli:"), "workspace.create"),
        (actions[1][0], "api_key.create"),
        ("adminkey", "api_key.block"),
        ("adminkey", "api_key.rotate"),
        ("adminkey", "workspace.update"),
    ]
    assert actions[0][0].startswith("cli:") and actions[1][0].startswith("cli:")
    api_rows = [e for e in mine if e["actor"].startswith("adminkey_")]
    assert all(e["request_id"] and e["address"] == "127.0.0.1" for e in api_rows)
    log = served.log_text()
    logged = [
        json.loads(r["message"]) for r in map(json.loads, _json_lines(log)) if r.get("logger") == "ezat_compat.audit"
    ]
    assert {e["id"] for e in api_rows} <= {e["id"] for e in logged}
    dumped = json.dumps(trail)
    for leaked in (secret, rotated, admin_key):
        assert leaked not in dumped and leaked not in log


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]
