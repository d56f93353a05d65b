"""The console's pages through the real app on a real SQLite database (Flask's test client), signed
in without an identity provider (tests/support/console.py): every page for each role, what an
organisation's admin and a viewer are refused, each change made through the admin service layer
with its audit row authored by the signed-in person, a key's secret shown once, the usage filters,
its pages and its CSV export.

The sign-in itself, sessions, CSRF and headers are test_console_auth.py's; the pages in a real
browser against a real identity provider are tests/browser/'s."""

from __future__ import annotations

import csv
import html
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import insert, select

from ezat_compat.admin import service
from ezat_compat.admin import spend as spend_service
from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.domain import Config
from ezat_compat.store.accounts import KeyInfo, OrgInfo, api_key_id
from ezat_compat.store.db import migrate
from ezat_compat.store.store import Store, open_store
from ezat_compat.store.tables import api_keys, audit_log, ledger
from tests.support.console import signed_in

pytestmark = pytest.mark.integration

MODEL = "anthropic/claude-sonnet-5-5"
OTHER_MODEL = "anthropic/claude-haiku-5"
USD = 1_000_000
ROLES = ("admin", "org_admin", "viewer")
ORG_PAGES = ("organisation", "keys_of_org", "usage_of_org")
PAGES = ("/console/", "/console/organisations", "/console/keys", "/console/limits", "/console/usage", "/console/audit")


def _config(root: Path) -> Config:
    models = [
        {
            "id": model_id,
            "aliases": [],
            "price": {"input": 3, "output": 15},
            "deployments": [{"name": "primary", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "m"}],
        }
        for model_id in (MODEL, OTHER_MODEL)
    ]
    data = {
        "gateway": {"database_url": f"sqlite:///{root / 'ezat.db'}", "data_dir": str(root)},
        "server": {"bind": "127.0.0.1:8080"},
        "admin": {"bind": "", "on_main_listener": True},
        "console": {"secure_cookies": False},
        "models": models,
    }
    return parse_config(data, path=str(root / "ezat.toml"), environ={})


@dataclass
class World:
    """The app, its store, two organisations with a key each, and a limit on each."""

    app: Flask
    store: Store
    a: OrgInfo
    b: OrgInfo
    key_a: KeyInfo
    key_b: KeyInfo
    limit_a: str
    limit_b: str


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    config = _config(tmp_path)
    migrate(config.gateway.database_url)
    store = open_store(config.gateway.database_url, config=config)
    app = create_app(config, store=store)
    cli = service.cli_context()
    a = service.create_org(store, cli, "team-a", 10 * USD)
    b = service.create_org(store, cli, "team-b", 10 * USD)
    key_a, _ = service.create_key(store, cli, a.name, name="a-ci")
    key_b, _ = service.create_key(store, cli, b.name, name="b-ci")
    limit_a = spend_service.set_limit(store, cli, spend_service.Scope("org", a.name), "monthly", 50 * USD)
    limit_b = spend_service.set_limit(store, cli, spend_service.Scope("org", b.name), "daily", 5 * USD)
    yield World(app, store, a, b, key_a, key_b, limit_a.public_id, limit_b.public_id)
    store.close()


def _key_row(store: Store, key: KeyInfo) -> tuple[int, int]:
    with store.engine.connect() as conn:
        row = conn.execute(select(api_keys.c.id, api_keys.c.org_id).where(api_keys.c.public_id == key.id)).one()
    return int(row.id), int(row.org_id)


def _bill(
    store: Store,
    key: KeyInfo,
    n: int = 1,
    *,
    cost: int = 12_300,
    status: int = 200,
    model: str = MODEL,
    at: datetime | None = None,
    tag: str = "r",
) -> None:
    """``n`` ledger rows of ``key``, a second apart, ending at ``at`` (now)."""
    key_id, org_id = _key_row(store, key)
    end = at or datetime.now(UTC)
    rows = [
        {
            "request_id": f"{tag}-{key.id}-{i}",
            "created_at": end - timedelta(seconds=i),
            "org_id": org_id,
            "key_id": key_id,
            "endpoint": "chat.completions",
            "model": model,
            "canonical_model": model,
            "deployment": "primary",
            "input_tokens": 10,
            "cache_write_tokens": 0,
            "cache_read_tokens": 0,
            "output_tokens": 5,
            "reasoning_tokens": 0,
            "cost_micros": cost if status == 200 else 0,
            "status": status,
            "estimated": False,
        }
        for i in range(n)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(ledger), rows)


def _client(world: World, role: str) -> tuple[FlaskClient, str]:
    client = world.app.test_client()
    session = signed_in(client, world.store, role=role, org_ids=[world.a.id] if role == "org_admin" else [])
    return client, session.csrf_token


def _text(answer: Any) -> str:
    return str(answer.get_data(as_text=True))


def _last_audit(store: Store) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(select(audit_log).order_by(audit_log.c.id.desc()).limit(1)).one()


def _audit_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return len(conn.execute(select(audit_log.c.id)).all())


# ---------------------------------------------------------------- every page, every role


@pytest.mark.parametrize("role", ROLES)
def test_every_page_renders_for_every_role(world: World, role: str) -> None:
    _bill(world.store, world.key_a, 3)
    client, _ = _client(world, role)
    pages = [*PAGES, f"/console/organisations/{world.a.public_id}", f"/console/keys/{world.key_a.id}"]
    if role != "org_admin":  # gateway-wide (test_an_organisation_admin_is_refused_…)
        pages.append("/console/deployments")
    for path in pages:
        answer = client.get(path)
        assert answer.status_code == 200, (path, _text(answer)[:500])
        page = _text(answer)
        assert answer.headers["Content-Security-Policy"].startswith("default-src 'self'"), path
        assert " style=" not in page and "<script>" not in page, path
        for nav in ("Overview", "Organisations", "Keys", "Limits", "Usage", "Audit", "Deployments"):
            assert f">{nav}</a>" in page, (path, nav)
        assert page.count("<table") == page.count("<caption>"), path
        for svg in re.findall(
            r"<svg[^>]*>.*?</svg>\s*(?:<figcaption[^<]*</figcaption>)?\s*<div[^>]*>\s*<table[^>]*>", page, re.S
        ):
            assert 'role="img"' in svg and "<title" in svg and 'class="chart-data"' in svg, path


def test_the_overview_shows_today_and_the_charts(world: World) -> None:
    _bill(world.store, world.key_a, 1, cost=12_300)
    _bill(world.store, world.key_b, 2, status=500, tag="failed")
    client, _ = _client(world, "admin")
    page = _text(client.get("/console/"))
    assert re.search(r'id="spend-today">\$0\.0123<', page)
    assert 'id="spend-chart"' in page and 'id="requests-chart"' in page
    assert re.search(r'id="errors-today">2<', page)
    assert "team-a" in page and "team-b" in page and MODEL in page


def test_an_organisation_admin_sees_only_their_organisations(world: World) -> None:
    _bill(world.store, world.key_a, 1, cost=1 * USD)
    _bill(world.store, world.key_b, 1, cost=7 * USD)
    client, _ = _client(world, "org_admin")
    overview = _text(client.get("/console/"))
    assert re.search(r'id="spend-today">\$1\.00<', overview) and "team-b" not in overview
    assert 'id="failovers"' not in overview  # gateway-wide signals are not theirs
    for path in ("/console/organisations", "/console/keys", "/console/limits", "/console/usage", "/console/audit"):
        page = _text(client.get(path))
        assert "team-b" not in page and world.key_b.id not in page and world.b.public_id not in page, path
    limits = _text(client.get("/console/limits"))
    assert "team-a" in limits and world.limit_a not in limits  # their organisation's cap shown, not theirs to delete


def test_an_organisation_admin_is_refused_another_organisations_pages_and_forms(world: World) -> None:
    client, csrf = _client(world, "org_admin")
    b, key_b = world.b.public_id, world.key_b.id
    for path in (
        f"/console/organisations/{b}",
        f"/console/keys/{key_b}",
        f"/console/keys?org={b}",
        f"/console/usage?org={b}",
        f"/console/usage?key={key_b}",
        f"/console/usage.csv?org={b}",
        "/console/deployments",
    ):
        answer = client.get(path)
        assert answer.status_code == 403, path
        assert "Not allowed" in _text(answer), path
    before = _audit_count(world.store)
    forms: list[tuple[str, dict[str, str]]] = [
        (f"/console/organisations/{b}/top-up", {"amount_usd": "5"}),
        (f"/console/organisations/{b}/suspend", {}),
        (f"/console/organisations/{b}/resume", {}),
        (f"/console/organisations/{b}/limits", {"rpm": "5"}),
        ("/console/keys", {"org": b, "name": "sneaky"}),
        (f"/console/keys/{key_b}/rotate", {"grace_seconds": "0"}),
        (f"/console/keys/{key_b}/block", {}),
        (f"/console/keys/{key_b}/unblock", {}),
        (f"/console/keys/{key_b}/revoke", {}),
        (f"/console/keys/{key_b}/limits", {"rpm": "5"}),
        ("/console/limits", {"scope": "org", "scope_id": "team-b", "amount_usd": "1", "period": "daily"}),
        ("/console/limits", {"scope": "key", "scope_id": key_b, "amount_usd": "1", "period": "daily"}),
        ("/console/limits", {"scope": "gateway", "scope_id": "", "amount_usd": "1", "period": "daily"}),
        (f"/console/limits/{world.limit_b}/delete", {}),
        ("/console/organisations", {"name": "new-org"}),
    ]
    for path, data in forms:
        answer = client.post(path, data={"csrf_token": csrf, **data})
        assert answer.status_code == 403, path
    assert _audit_count(world.store) == before
    assert world.store.accounts.get_org("team-b").balance_micros == 10 * USD
    assert world.store.accounts.get_key(key_b).status(datetime.now(UTC)) == "active"


def test_a_viewer_changes_nothing(world: World) -> None:
    client, csrf = _client(world, "viewer")
    page = _text(client.get(f"/console/keys/{world.key_a.id}"))
    assert ">Rotate<" not in page and ">Revoke<" not in page
    assert ">Create key<" not in _text(client.get("/console/keys"))
    before = _audit_count(world.store)
    for path, data in (
        (f"/console/organisations/{world.a.public_id}/top-up", {"amount_usd": "5"}),
        ("/console/keys", {"org": world.a.public_id, "name": "x"}),
        (f"/console/keys/{world.key_a.id}/revoke", {}),
        ("/console/limits", {"scope": "gateway", "amount_usd": "1", "period": "daily"}),
        (f"/console/limits/{world.limit_a}/delete", {}),
    ):
        assert client.post(path, data={"csrf_token": csrf, **data}).status_code == 403, path
    assert _audit_count(world.store) == before


def test_a_form_without_its_csrf_token_changes_nothing(world: World) -> None:
    client, _ = _client(world, "admin")
    answer = client.post(f"/console/organisations/{world.a.public_id}/top-up", data={"amount_usd": "5"})
    assert answer.status_code == 400
    assert world.store.accounts.get_org("team-a").balance_micros == 10 * USD


# ---------------------------------------------------------------- the changes and their trail


def _post(client: FlaskClient, csrf: str, path: str, **data: str) -> Any:
    return client.post(path, data={"csrf_token": csrf, **data})


def _followed(client: FlaskClient, answer: Any) -> str:
    assert answer.status_code == 303, _text(answer)[:300]
    return _text(client.get(answer.headers["Location"]))


def test_an_organisation_admin_changes_nothing_of_the_organisation_itself(world: World) -> None:
    """Its balance, status and caps, and its own spend limit, are the gateway admins': a team's
    lead hands out the team's budget to its keys, never tops it up, lifts a suspension or raises it."""
    client, csrf = _client(world, "org_admin")
    org = f"/console/organisations/{world.a.public_id}"
    page = _text(client.get(org))
    assert "Top up" not in page and "Save limits" not in page and "Suspend" not in page
    before, balance = _audit_count(world.store), world.store.accounts.get_org("team-a").balance_micros
    for path, form in (
        (f"{org}/top-up", {"amount_usd": "5"}),
        (f"{org}/suspend", {}),
        (f"{org}/resume", {}),
        (f"{org}/limits", {"rpm": "5"}),
        ("/console/limits", {"scope": "org", "scope_id": "team-a", "amount_usd": "1000", "period": "daily"}),
        (f"/console/limits/{world.limit_a}/delete", {}),
    ):
        answer = _post(client, csrf, path, **form)
        assert answer.status_code == 403 and "Not allowed" in _text(answer), path
    after = world.store.accounts.get_org("team-a")
    assert (after.balance_micros, after.suspended, after.rpm) == (balance, False, None)
    assert _audit_count(world.store) == before


@pytest.mark.parametrize("role", ["admin"])
def test_each_organisation_action_works_and_leaves_an_audit_row_by_the_person(world: World, role: str) -> None:
    client, csrf = _client(world, role)
    actor = f"sso:test-{role}"
    org = f"/console/organisations/{world.a.public_id}"
    page = _followed(client, _post(client, csrf, f"{org}/top-up", amount_usd="2.5"))
    assert "Added $2.50 to team-a" in page
    assert world.store.accounts.get_org("team-a").balance_micros == 12_500_000
    assert (_last_audit(world.store).actor, _last_audit(world.store).action) == (actor, "workspace.top_up")

    _followed(client, _post(client, csrf, f"{org}/suspend"))
    assert world.store.accounts.get_org("team-a").suspended
    assert (_last_audit(world.store).actor, _last_audit(world.store).action) == (actor, "workspace.archive")
    _followed(client, _post(client, csrf, f"{org}/resume"))
    assert not world.store.accounts.get_org("team-a").suspended
    assert _last_audit(world.store).action == "workspace.unarchive"

    _followed(client, _post(client, csrf, f"{org}/limits", rpm="60", tpm="", models="anthropic/claude-*"))
    after = world.store.accounts.get_org("team-a")
    assert (after.rpm, after.tpm, after.models) == (60, None, ("anthropic/claude-*",))
    assert (_last_audit(world.store).actor, _last_audit(world.store).action) == (actor, "workspace.update")
    row = _last_audit(world.store)
    assert row.address == "127.0.0.1" and row.request_id

    refused = _followed(client, _post(client, csrf, f"{org}/top-up", amount_usd="-3"))
    assert "notice-error" in refused and "must not be negative" in refused


def test_a_created_key_shows_its_secret_once_with_snippets(world: World) -> None:
    client, csrf = _client(world, "org_admin")
    answer = _post(client, csrf, "/console/keys", org=world.a.public_id, name="laptop", models="", expires_at="")
    assert answer.status_code == 200
    page = _text(answer)
    secret = re.search(r'<code id="new-secret">(ezat_sk_[A-Za-z0-9]+)</code>', page)
    assert secret is not None
    assert 'data-copy="#new-secret"' in page
    page = html.unescape(page)
    assert "curl http://127.0.0.1:8080/openai/v1/chat/completions" in page
    assert f'base_url="http://127.0.0.1:8080/openai/v1", api_key="{secret.group(1)}"' in page
    assert f'anthropic.Anthropic(base_url="http://127.0.0.1:8080", api_key="{secret.group(1)}")' in page
    assert answer.headers["Cache-Control"] == "no-store"
    created = next(k for k in world.store.accounts.list_keys("team-a") if k.name == "laptop")
    audit = _last_audit(world.store)
    assert (audit.actor, audit.action, audit.target_id) == (
        "sso:test-org_admin",
        "api_key.create",
        api_key_id(created.id),
    )
    assert secret.group(1) not in (audit.after or "")
    for path in (
        f"/console/keys/{created.id}",
        "/console/keys",
        "/console/audit",
        f"/console/organisations/{world.a.public_id}",
    ):
        assert secret.group(1) not in _text(client.get(path)), path
    # the key works with the gateway at once
    assert world.store.accounts.authenticate(secret.group(1), datetime.now(UTC)).key_public_id == created.id


def test_each_key_action_works_and_leaves_an_audit_row_by_the_person(world: World) -> None:
    client, csrf = _client(world, "admin")
    key = f"/console/keys/{world.key_a.id}"
    now = datetime.now(UTC)
    rotated = _post(client, csrf, f"{key}/rotate", grace_seconds="3600")
    assert rotated.status_code == 200
    secret = re.search(r'<code id="new-secret">(ezat_sk_[A-Za-z0-9]+)</code>', _text(rotated))
    assert secret is not None and "keeps working for 3,600 seconds" in _text(rotated)
    assert world.store.accounts.authenticate(secret.group(1), now).key_public_id == world.key_a.id
    audit = _last_audit(world.store)
    assert (audit.actor, audit.action) == ("sso:test-admin", "api_key.rotate") and '"grace_seconds":3600' in audit.after

    _followed(client, _post(client, csrf, f"{key}/block"))
    assert world.store.accounts.get_key(world.key_a.id).status(now) == "inactive"
    assert _last_audit(world.store).action == "api_key.block"
    _followed(client, _post(client, csrf, f"{key}/unblock"))
    assert world.store.accounts.get_key(world.key_a.id).status(now) == "active"
    assert _last_audit(world.store).action == "api_key.unblock"
    _followed(client, _post(client, csrf, f"{key}/limits", name="renamed", rpm="10", tpm="1000", models=MODEL))
    changed = world.store.accounts.get_key(world.key_a.id)
    assert (changed.name, changed.rpm, changed.tpm, changed.models) == ("renamed", 10, 1000, (MODEL,))
    assert _last_audit(world.store).action == "api_key.update"
    page = _followed(client, _post(client, csrf, f"{key}/revoke"))
    assert world.store.accounts.get_key(world.key_a.id).status(now) == "archived"
    assert _last_audit(world.store).action == "api_key.archive" and "is revoked" in page
    refused = _followed(client, _post(client, csrf, f"{key}/rotate", grace_seconds="0"))
    assert "archived" in refused and "notice-error" in refused
    assert all(row_actor == "sso:test-admin" for row_actor in _actors_since_setup(world))


def _actors_since_setup(world: World) -> list[str]:
    with world.store.engine.connect() as conn:
        return [r.actor for r in conn.execute(select(audit_log.c.actor)) if not r.actor.startswith("cli:")]


def test_spend_limits_are_set_shown_and_deleted_with_their_trail(world: World) -> None:
    _bill(world.store, world.key_a, 1, cost=1 * USD)
    client, csrf = _client(world, "org_admin")
    page = _followed(
        client,
        _post(
            client,
            csrf,
            "/console/limits",
            scope="key",
            scope_id=world.key_a.id,
            amount_usd="4",
            period="weekly",
            thresholds="50, 90",
        ),
    )
    assert "Saved the weekly spend limit of key" in page
    audit = _last_audit(world.store)
    assert (audit.actor, audit.action) == ("sso:test-org_admin", "spend_limit.create")
    assert world.store.spend is not None
    limit = next(s for s in world.store.spend.list_limits() if s.scope_type == "key")
    assert (limit.amount_micros, limit.thresholds) == (4 * USD, (50, 90))
    assert 'meter min="0" max="100"' in page
    _followed(client, _post(client, csrf, f"/console/limits/{limit.public_id}/delete"))
    assert _last_audit(world.store).action == "spend_limit.delete"
    assert all(s.public_id != limit.public_id for s in world.store.spend.list_limits())
    bad = _followed(
        client,
        _post(client, csrf, "/console/limits", scope="key", scope_id=world.key_a.id, amount_usd="x", period="daily"),
    )
    assert "notice-error" in bad


def test_an_admin_creates_an_organisation(world: World) -> None:
    client, csrf = _client(world, "admin")
    page = _followed(client, _post(client, csrf, "/console/organisations", name="team-c", balance_usd="20"))
    assert "Organisation team-c created." in page
    assert world.store.accounts.get_org("team-c").balance_micros == 20 * USD
    assert (_last_audit(world.store).actor, _last_audit(world.store).action) == ("sso:test-admin", "workspace.create")


def test_a_notice_in_a_link_someone_else_made_is_not_shown(world: World) -> None:
    client, _ = _client(world, "admin")
    page = _text(client.get("/console/organisations?notice=success:Your+session+expired&sig=" + "0" * 32))
    assert "Your session expired" not in page


# ---------------------------------------------------------------- usage: filters, pages, CSV


def test_the_usage_page_filters_pages_and_charts(world: World) -> None:
    _bill(world.store, world.key_a, 60, tag="ok")
    _bill(world.store, world.key_a, 3, status=500, tag="bad", at=datetime.now(UTC) - timedelta(minutes=5))
    _bill(world.store, world.key_b, 4, model=OTHER_MODEL, tag="b")
    client, _ = _client(world, "admin")
    page = _text(client.get("/console/usage"))
    assert 'id="usage-chart"' in page and 'id="usage-rows"' in page and "Download CSV" in page
    assert re.search(r'id="usage-requests">67<', page)
    assert page.count('<tr class="failed">') == 0  # the newest 50 are the successful ones
    older = re.search(r'href="([^"]*after=[^"]*)"[^>]*>Older<', page)
    assert older is not None
    second = _text(client.get(older.group(1).replace("&amp;", "&")))
    assert second.count('<tr class="failed">') == 3
    rows = re.findall(r"<tr(?: class=\"failed\")?>\s*<td class=\"nowrap\"", page + second)
    assert len(rows) == 67
    failed = _text(client.get("/console/usage?status=error"))
    assert failed.count('<tr class="failed">') == 3 and "count every status" in failed
    by_model = _text(client.get(f"/console/usage?model={OTHER_MODEL}"))
    assert re.search(r'id="usage-requests">4<', by_model) and "team-a" not in by_model.split('id="usage-rows"')[1]
    by_key = _text(client.get(f"/console/usage?key={world.key_b.id}&metric=requests"))
    assert re.search(r'id="usage-requests">4<', by_key)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert re.search(r'id="usage-requests">0<', _text(client.get(f"/console/usage?from={tomorrow}&to={tomorrow}")))
    bad = client.get("/console/usage?from=yesterday")
    assert bad.status_code == 400 and "is not a date" in _text(bad)


def test_the_csv_export_streams_the_filtered_rows(world: World) -> None:
    _bill(world.store, world.key_a, 7, tag="a")
    _bill(world.store, world.key_b, 2, tag="b")
    with world.store.engine.begin() as conn:
        conn.execute(api_keys.update().where(api_keys.c.public_id == world.key_a.id).values(name="=HYPERLINK(1)"))
    client, _ = _client(world, "admin")
    answer = client.get(f"/console/usage.csv?org={world.a.public_id}")
    assert answer.status_code == 200 and answer.mimetype == "text/csv"
    assert answer.headers["Content-Disposition"].startswith('attachment; filename="usage-')
    rows = list(csv.DictReader(io.StringIO(_text(answer))))
    assert len(rows) == 7
    assert {r["org"] for r in rows} == {"team-a"} and rows[0]["cost_usd"] == "0.012300"
    assert rows[0]["key_name"] == "'=HYPERLINK(1)"
    assert [r["created_at"] for r in rows] == sorted((r["created_at"] for r in rows), reverse=True)
    everything = list(csv.DictReader(io.StringIO(_text(client.get("/console/usage.csv")))))
    assert len(everything) == 9
    org_admin, _ = _client(world, "org_admin")
    theirs = list(csv.DictReader(io.StringIO(_text(org_admin.get("/console/usage.csv")))))
    assert len(theirs) == 7


# ---------------------------------------------------------------- the audit trail and deployments


def test_the_audit_page_lists_who_changed_what(world: World) -> None:
    client, csrf = _client(world, "admin")
    _post(client, csrf, f"/console/organisations/{world.b.public_id}/top-up", amount_usd="1")
    page = _text(client.get("/console/audit"))
    table = page.split('id="audit-rows"')[1]
    for column in ("When", "Who", "Action", "Target", "From"):
        assert f">{column}</th>" in table
    assert "sso:test-admin" in table and "workspace.top_up" in table and "balance_usd: 10.000000 → 11.000000" in table
    org_admin, _ = _client(world, "org_admin")
    theirs = _text(org_admin.get("/console/audit")).split('id="audit-rows"')[1]
    assert world.b.public_id not in theirs and world.a.public_id in theirs


def test_the_deployments_page_shows_cooldowns(world: World) -> None:
    gateway = world.app.extensions["ezat"]
    import time

    gateway.cooldowns.failure(f"{MODEL}/primary", time.time(), retry_after=120)
    client, _ = _client(world, "viewer")
    page = _text(client.get("/console/deployments"))
    assert 'id="cooling-count">1<' in page
    row = page.split(f"<code>{MODEL}</code>")[1].split("</tr>")[0]
    assert "cooling" in row and "s left" in row
    assert "127.0.0.1:9" in page and "/v1" not in row
