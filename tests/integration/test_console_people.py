"""The console's People page (console/pages.py ``people``) through the real app on a real SQLite
database (Flask's test client, signed in without an identity provider: tests/support/console.py):
people with their groups, organisation, last sign-in, this month's spend and status, and the
groups' mappings; disabling, enabling and revoking keys with the session's CSRF token, each with
its audit row authored by the signed-in person; a viewer changing nothing and an organisation's
admin refused.

And the console's sign-in against a real OpenID Connect provider on loopback (the ``console``
fixture of tests/support/console_auth.py, as test_console_auth.py uses it): it records the person
as every sign-in does, a console admin in no mapped group still signs in, and a disabled person
is refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ezat_compat.admin import service
from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.domain import Config, IdentitySettings
from ezat_compat.store.db import migrate
from ezat_compat.store.people import SOURCE_CONFIG, NoOrganisationError
from ezat_compat.store.store import Store, open_store
from tests.support.console import signed_in
from tests.support.console_auth import Browser, Console

# The sign-in's fixtures (the console on loopback, its clock put back before each test): pytest
# finds them here.
from tests.support.console_auth import console as console
from tests.support.console_auth import wall_clock as wall_clock
from tests.support.stores import entry

pytestmark = pytest.mark.integration

USD = 1_000_000
IDENTITY = IdentitySettings(groups_claim="groups")


def _config(root: Path) -> Config:
    data = {
        "gateway": {"database_url": f"sqlite:///{root / 'ezat.db'}", "data_dir": str(root)},
        "admin": {"bind": "", "on_main_listener": True},
        "console": {"secure_cookies": False},
        "models": [
            {
                "id": "anthropic/m",
                "aliases": [],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "u"}],
            }
        ],
    }
    return parse_config(data, path=str(root / "ezat.toml"), environ={})


@dataclass
class World:
    app: Flask
    store: Store
    ada: str  # public ids
    bob: str


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    config = _config(tmp_path)
    migrate(config.gateway.database_url)
    store = open_store(config.gateway.database_url, config=config)
    app = create_app(config, store=store)
    assert store.people is not None
    service.create_org(store, service.cli_context(), "research", 100 * USD)
    store.people.put_group("ml-team", org="research", models=["anthropic/*"], daily_micros=5 * USD)
    store.people.put_group("platform", source=SOURCE_CONFIG)
    ada = store.people.sign_in({"sub": "s-ada", "email": "ada@example.com", "groups": ["ml-team", "misc"]}, IDENTITY)
    with pytest.raises(NoOrganisationError):
        store.people.sign_in({"sub": "s-bob", "email": "bob@example.com", "groups": []}, IDENTITY)
    _, secret = store.people.mint_key(ada, hours=1)
    now = datetime.now(UTC)
    store.ledger.settle("r-ada", entry(store.accounts.authenticate(secret, now), 2_500_000, created_at=now))
    yield World(app, store, ada.public_id, store.people.get("bob@example.com").public_id)
    store.close()


def _client(world: World, role: str) -> tuple[FlaskClient, str]:
    client = world.app.test_client()
    assert world.store.accounts.find_org("research") is not None
    org_ids = [world.store.accounts.get_org("research").id] if role == "org_admin" else []
    session = signed_in(client, world.store, role=role, org_ids=org_ids, subject=f"sub-{role}")
    return client, session.csrf_token


def _text(answer: Any) -> str:
    return str(answer.get_data(as_text=True))


def _audit(store: Store, action: str) -> list[Any]:
    assert store.admin is not None
    return [e for e in store.admin.entries(limit=200) if e.action == action]


def test_the_people_page_shows_people_and_groups(world: World) -> None:
    client, _ = _client(world, "admin")
    answer = client.get("/console/people")
    assert answer.status_code == 200, _text(answer)[:500]
    page = _text(answer)
    assert ">People</a>" in page and " style=" not in page and page.count("<table") == page.count("<caption>")
    row = re.search(r"<tr>\s*<th scope=\"row\">ada@example\.com.*?</tr>", page, re.S)
    assert row is not None
    ada = row.group(0)
    assert "<strong>ml-team</strong>" in ada and "misc" in ada and "research" in ada
    assert "$2.50" in ada and "badge-active" in ada and "Disable" in ada and "just now" in ada
    assert "bob@example.com" in page
    groups = page[page.index('id="group-rows"') :]
    assert "ml-team" in groups and "$5.000000" in groups and "the configuration file" in groups


def test_disable_enable_and_revoke_keys_with_their_audit_rows(world: World) -> None:
    client, csrf = _client(world, "admin")
    assert world.store.people is not None
    answer = client.post(f"/console/people/{world.ada}/disable", data={"csrf_token": csrf, "revoke_keys": "on"})
    assert answer.status_code == 303
    assert world.store.people.get(world.ada).disabled_at is not None
    (row,) = _audit(world.store, "user.disable")
    assert row.actor == "sso:sub-admin" and row.target_id == world.ada and row.after["live_keys"] == 0
    page = _text(client.get(answer.headers["Location"]))
    assert "is disabled: refused at their next request, their keys revoked." in page and "badge-disabled" in page

    assert client.post(f"/console/people/{world.ada}/enable", data={"csrf_token": csrf}).status_code == 303
    assert world.store.people.get(world.ada).disabled_at is None and len(_audit(world.store, "user.enable")) == 1

    key, _ = world.store.people.mint_key(world.store.people.get(world.ada), hours=1)
    assert client.post(f"/console/people/{world.ada}/revoke-keys", data={"csrf_token": csrf}).status_code == 303
    assert world.store.accounts.get_key(key.id).revoked_at is not None
    assert [e.actor for e in _audit(world.store, "user.revoke_keys")] == ["sso:sub-admin"]

    forged = client.post(f"/console/people/{world.bob}/disable", data={"csrf_token": "nope"})
    assert forged.status_code == 400 and world.store.people.get(world.bob).disabled_at is None
    unknown = client.post("/console/people/user_nobody/disable", data={"csrf_token": csrf})
    assert "user_nobody" in _text(client.get(unknown.headers["Location"]))


def test_a_viewer_reads_and_an_organisation_admin_is_refused(world: World) -> None:
    viewer, csrf = _client(world, "viewer")
    page = _text(viewer.get("/console/people"))
    assert "ada@example.com" in page and "Disable" not in page and "Revoke keys" not in page
    assert viewer.post(f"/console/people/{world.ada}/disable", data={"csrf_token": csrf}).status_code == 403
    assert world.store.people is not None and world.store.people.get(world.ada).disabled_at is None

    lead, csrf = _client(world, "org_admin")
    assert lead.get("/console/people").status_code == 403
    assert ">People</a>" not in _text(lead.get("/console/"))
    assert lead.post(f"/console/people/{world.ada}/revoke-keys", data={"csrf_token": csrf}).status_code == 403


# ---------------------------------------------------------------- usage by person and by group


def _carl(world: World) -> str:
    """Carl, of another organisation (through the group ``ops``), with a request of $1.25."""
    assert world.store.people is not None
    service.create_org(world.store, service.cli_context(), "elsewhere", 100 * USD)
    world.store.people.put_group("ops", org="elsewhere")
    carl = world.store.people.sign_in({"sub": "s-carl", "email": "carl@example.com", "groups": ["ops"]}, IDENTITY)
    _, secret = world.store.people.mint_key(carl, hours=1)
    now = datetime.now(UTC)
    world.store.ledger.settle(
        "r-carl", entry(world.store.accounts.authenticate(secret, now), 1_250_000, created_at=now)
    )
    return carl.public_id


def _usage_rows(page: str) -> str:
    return page[page.index('id="usage-rows"') :]


def test_usage_by_person_and_by_group(world: World) -> None:
    carl = _carl(world)
    client, _ = _client(world, "viewer")
    everyone = _text(client.get("/console/usage"))
    assert re.search(r'id="usage-requests">2<', everyone) and 'id="f-person"' in everyone

    for ref in (world.ada, "ada@example.com"):
        answer = client.get(f"/console/usage?person={ref}")
        assert answer.status_code == 200, _text(answer)[:500]
        page = _text(answer)
        assert re.search(r'id="usage-requests">1<', page) and re.search(r'id="usage-spend">\$2\.50<', page)
        assert "ada@example.com" in _usage_rows(page) and "carl@example.com" not in _usage_rows(page)
    by_carl = _text(client.get(f"/console/usage?person={carl}"))
    assert re.search(r'id="usage-spend">\$1\.25<', by_carl) and "ada@example.com" not in _usage_rows(by_carl)
    nobody = _text(client.get(f"/console/usage?person={world.bob}"))  # no key: nothing
    assert re.search(r'id="usage-requests">0<', nobody) and "No requests match" in nobody
    assert client.get("/console/usage?person=user_nobody").status_code == 404

    by_group = _text(client.get("/console/usage?group=ml-team"))
    assert re.search(r'id="usage-requests">1<', by_group) and re.search(r'id="usage-spend">\$2\.50<', by_group)
    assert "ada@example.com" in _usage_rows(by_group) and "carl@example.com" not in _usage_rows(by_group)
    assert re.search(r'id="usage-requests">0<', _text(client.get(f"/console/usage?group=ml-team&person={carl}")))
    assert client.get("/console/usage?group=nothing-mapped").status_code == 404
    csv_text = _text(client.get("/console/usage.csv?group=ops"))
    assert len(csv_text.strip().splitlines()) == 2 and "carl@example.com" in csv_text

    # An organisation's admin (of research) sees Ada's requests, not Carl's: 403, as for a key of
    # another organisation.
    lead, _ = _client(world, "org_admin")
    theirs = _text(lead.get("/console/usage?person=ada@example.com"))
    assert re.search(r'id="usage-requests">1<', theirs) and "ada@example.com" in _usage_rows(theirs)
    for path in (f"/console/usage?person={carl}", "/console/usage?group=ops", f"/console/usage.csv?person={carl}"):
        refused = lead.get(path)
        assert refused.status_code == 403 and "carl@example.com" not in _text(refused), path


def test_the_people_page_shows_each_groups_spend_and_links_to_usage(world: World) -> None:
    carl = _carl(world)
    assert world.store.people is not None
    erin = world.store.people.sign_in({"sub": "s-erin", "email": "erin@example.com", "groups": ["ml-team"]}, IDENTITY)
    _, secret = world.store.people.mint_key(erin, hours=1)
    now = datetime.now(UTC)
    world.store.ledger.settle("r-erin", entry(world.store.accounts.authenticate(secret, now), 500_000, created_at=now))
    client, _ = _client(world, "admin")
    page = _text(client.get("/console/people"))
    groups = page[page.index('id="group-rows"') :]
    rows = {
        name: re.search(rf'<th scope="row">{name}<.*?</tr>', groups, re.S).group(0)  # type: ignore[union-attr]
        for name in ("ml-team", "ops", "platform")
    }
    assert ">$3.00<" in rows["ml-team"] and ">$1.25<" in rows["ops"] and ">$0<" in rows["platform"]
    ops = world.store.people.get_group("ops").public_id
    assert f"/console/usage?group={ops}&amp;from=" in rows["ops"]
    assert f"/console/usage?person={carl}&amp;from=" in page
    link = re.search(rf'href="(/console/usage\?group={ops}[^"]*)"', rows["ops"])
    assert link is not None
    linked = _text(client.get(link.group(1).replace("&amp;", "&")))
    assert re.search(r'id="usage-spend">\$1\.25<', linked)


# ---------------------------------------------------------------- the sign-in records the person


def test_the_console_sign_in_records_the_person_and_refuses_a_disabled_one(console: Console) -> None:
    people = console.store.people
    assert people is not None
    browser = Browser(console)
    assert browser.sign_in("alice").status_code == 303  # a gateway admin, in no mapped group
    alice = people.get("alice@example.com")
    assert alice.subject == "alice" and alice.org == "" and alice.last_sign_in_at is not None
    assert browser.get("/console/people").status_code == 200

    people.set_disabled("alice", True)
    try:
        # the session she had is over at her next page
        ended = browser.get("/console/people")
        assert ended.status_code in (302, 303) and "sign-in" in ended.headers["Location"], ended.status_code
        assert not browser.signed_in()
        refused = Browser(console).sign_in("alice")
        assert refused.status_code == 403 and "disabled" in refused.text
        reasons = [
            e.after.get("reason")
            for e in console.store.admin.entries(limit=200)  # type: ignore[union-attr]
            if e.action == "console.sign_in_refused" and e.target_id == "alice"
        ]
        assert reasons == ["disabled"]
    finally:
        people.set_disabled("alice", False)
    assert Browser(console).sign_in("alice").status_code == 303
