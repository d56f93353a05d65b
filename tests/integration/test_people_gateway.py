"""People through the real gateway (gunicorn, two gevent workers a node): a person's daily cap
stops them with a 402 naming the cap while a teammate goes on, and holds under concurrency; a
group without a model gets a 403 for it; a disabled person's next request is refused on every
worker and node within a second; the ledger names the person.

People are made as a sign-in makes them (``People.sign_in`` with an ID token's claims) on the
gateway's database; the groups come from the file's ``[identity.groups]``, written into the
database by ``serve`` at start. Two stacks: SQLite with one node, and PostgreSQL with Redis and
two nodes (two gunicorn masters on one database)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import cycle
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, create_engine, select

from ezat_compat.config import load_config
from ezat_compat.domain import IdentitySettings
from ezat_compat.pricing import usd_to_micros
from ezat_compat.store.people import People, PersonInfo
from ezat_compat.store.spend import SCOPE_USER
from ezat_compat.store.store import Store, open_store
from ezat_compat.store.tables import idp_groups, ledger, spend_counters, spend_limits
from tests.integration.conftest import standard_models
from tests.integration.harness import Sim
from tests.support.spend_limits import TabledGateway
from tests.support.stacks import flushed_redis, postgres_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SONNET = "anthropic/claude-sonnet-5-5"
HAIKU = "anthropic/claude-haiku-4-5"
CHAT = "/openai/v1/chat/completions"
MESSAGES = "/v1/messages"
DAILY_USD = "0.02"  # each developer's own daily cap: a few of the requests below
REDIS_DB = 12  # a database number no other suite uses; flushed before and after
STACKS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql+redis", id="postgresql+redis-two-nodes", marks=[pytest.mark.postgres, pytest.mark.redis]),
]
IDENTITY = f"""
[admin]
bind = ""
on_main_listener = true

[identity.groups.developers]
org = "eng"
models = ["claude-sonnet-*", "claude-haiku-*"]
daily_usd = {DAILY_USD}

[identity.groups.interns]
org = "eng"
models = ["claude-haiku-*"]

[identity.groups.metered]
org = "eng"
rpm = 4
"""


@dataclass
class Stack:
    nodes: list[TabledGateway]
    engine: Engine
    store: Store
    identity: IdentitySettings

    @property
    def people(self) -> People:
        assert self.store.people is not None
        return self.store.people

    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def person(self, name: str, *groups: str) -> tuple[PersonInfo, str]:
        """A person signed in for the first time (a fresh subject), and a key minted for them."""
        subject = f"{name}-{uuid.uuid4().hex[:8]}"
        claims = {"sub": subject, "email": f"{subject}@example.com", "name": name.title(), "groups": list(groups)}
        person = self.people.sign_in(claims, self.identity)
        _, secret = self.people.mint_key(person, hours=1, client="tests")
        return person, secret

    def ledger_users(self, key_user: int) -> list[int | None]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(ledger.c.user_id).where(ledger.c.user_id == key_user)).scalars())


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"people-{kind.replace('+', '-')}")
    database_url = f"sqlite:///{(root / 'ezat.db').as_posix()}"
    redis_url = ""
    with ExitStack() as cleanup:
        if kind.startswith("postgresql"):
            database_url = postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_people")
            redis_url = flushed_redis(cleanup, request.getfixturevalue("redis_url"), REDIS_DB)
        nodes = []
        for n in range(2 if redis_url else 1):
            node = TabledGateway(
                root=root / f"node-{n}",
                models=standard_models(sim.url),
                workers=2,
                gateway_settings={"keepalive_s": 1, "database_url": database_url, "redis_url": redis_url},
                env={"EZAT_DATABASE_URL": database_url, "EZAT_REDIS_URL": redis_url, "EZAT_ADMIN_BIND": ""},
                tables=IDENTITY,
            )
            cleanup.callback(node.stop)
            nodes.append(node.start())
        # serve made the file's groups and the organisation they name (empty): fund it.
        nodes[0].cli("orgs", "top-up", "eng", "100")
        engine = create_engine(database_url)
        cleanup.callback(engine.dispose)
        store = open_store(database_url)
        cleanup.callback(store.close)
        identity = load_config(nodes[0].config_path).identity
        yield Stack(nodes=nodes, engine=engine, store=store, identity=identity)


# The simulator writes until max_tokens: each request spends about its worst case (~$0.003).
WORDS = "[[sim:words=400]] Write an essay."


def chat(model: str = SONNET, max_tokens: int = 200) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": WORDS}]}


def post(url: str, key: str, body: dict[str, Any], path: str = CHAT) -> requests.Response:
    headers = {"authorization": f"Bearer {key}"} if path == CHAT else {"x-api-key": key}
    return requests.post(url + path, json=body, headers=headers, timeout=60)


def test_the_files_groups_are_in_the_database_with_their_organisation(stack: Stack) -> None:
    with stack.engine.connect() as conn:
        rows = {r.name: r for r in conn.execute(select(idp_groups))}
    assert set(rows) == {"developers", "interns", "metered"}
    assert rows["metered"].rpm == 4 and rows["metered"].tpm is None
    assert {r.source for r in rows.values()} == {"config"}
    assert rows["developers"].daily_micros == usd_to_micros(DAILY_USD)
    assert rows["interns"].models == "claude-haiku-*"
    groups = {g.name: g for g in stack.people.list_groups()}
    assert groups["developers"].org == groups["interns"].org == "eng"


def test_a_persons_daily_cap_stops_them_with_a_402_while_a_teammate_goes_on(stack: Stack) -> None:
    alice, alice_key = stack.person("alice", "developers")
    bob, bob_key = stack.person("bob", "developers")
    # Each developer got the group's cap as a spend limit of their own at sign-in.
    assert stack.store.spend is not None
    mine = [s for s in stack.store.spend.list_limits([SCOPE_USER]) if s.scope_id == alice.id]
    assert [(s.period, s.amount_micros) for s in mine] == [("daily", usd_to_micros(DAILY_USD))]
    urls = cycle(stack.urls())
    statuses = []
    refusal: requests.Response | None = None
    for _ in range(40):
        response = post(next(urls), alice_key, chat())
        statuses.append(response.status_code)
        if response.status_code != 200:
            refusal = response
            break
    assert refusal is not None, "the daily cap never stopped alice"
    assert statuses[:-1] and set(statuses[:-1]) == {200}, statuses
    assert refusal.status_code == 402, refusal.text
    error = refusal.json()["error"]
    assert error["type"] == "insufficient_quota"
    assert "daily spend limit of user" in error["message"] and alice.email in error["message"], error["message"]
    # the native dialect says it in its own envelope
    native = post(next(urls), alice_key, chat(), MESSAGES)
    assert native.status_code == 402, native.text
    assert native.json()["type"] == "error" and alice.email in native.json()["error"]["message"]
    # her teammate, in the same group and organisation, goes on
    for url in stack.urls():
        assert post(url, bob_key, chat()).status_code == 200
    # the ledger names each of them (a request refused before admission has no row), and her
    # spend stayed within her cap
    assert len(stack.ledger_users(alice.id)) == len(statuses) - 1
    assert stack.ledger_users(bob.id)
    with stack.engine.connect() as conn:
        spent = conn.execute(
            select(spend_counters.c.spent_micros, spend_counters.c.reserved_micros)
            .join(spend_limits, spend_limits.c.id == spend_counters.c.limit_id)
            .where(spend_limits.c.scope_type == SCOPE_USER, spend_limits.c.scope_id == alice.id)
        ).one()
    assert spent.reserved_micros == 0
    assert 0 < spent.spent_micros <= usd_to_micros(DAILY_USD)


def test_concurrent_requests_never_take_a_person_past_their_cap(stack: Stack) -> None:
    carol, carol_key = stack.person("carol", "developers")
    urls = stack.urls()
    with ThreadPoolExecutor(max_workers=30) as pool:
        responses = list(pool.map(lambda i: post(urls[i % len(urls)], carol_key, chat()), range(60)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 402}, statuses
    assert 200 in statuses and 402 in statuses, statuses
    with stack.engine.connect() as conn:
        spent = conn.execute(
            select(spend_counters.c.spent_micros, spend_counters.c.reserved_micros)
            .join(spend_limits, spend_limits.c.id == spend_counters.c.limit_id)
            .where(spend_limits.c.scope_type == SCOPE_USER, spend_limits.c.scope_id == carol.id)
        ).one()
        billed = conn.execute(
            select(ledger.c.cost_micros).where(ledger.c.user_id == carol.id, ledger.c.status == 200)
        ).scalars()
        total = sum(billed)
    assert spent.reserved_micros == 0
    assert spent.spent_micros == total <= usd_to_micros(DAILY_USD)
    assert len(stack.ledger_users(carol.id)) == statuses.count(200)  # a row per admitted request


def test_a_group_without_a_model_gets_a_403_for_it(stack: Stack) -> None:
    _dave, dave_key = stack.person("dave", "interns")
    url = stack.urls()[-1]
    refused = post(url, dave_key, chat(SONNET))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "permission_error"
    native = post(url, dave_key, chat(SONNET), MESSAGES)
    assert native.status_code == 403 and native.json()["error"]["type"] == "permission_error"
    assert post(url, dave_key, chat(HAIKU)).status_code == 200
    # in both groups, the models of either
    _erin, erin_key = stack.person("erin", "interns", "developers")
    assert post(url, erin_key, chat(SONNET)).status_code == 200
    # a group the gateway doesn't know gives nothing: the person's other groups decide
    _frank, frank_key = stack.person("frank", "interns", "some-idp-group")
    assert post(url, frank_key, chat(SONNET)).status_code == 403


def test_a_person_in_no_mapped_group_gets_no_key(stack: Stack) -> None:
    from ezat_compat.store.people import NoOrganisationError

    claims = {"sub": f"nobody-{uuid.uuid4().hex[:8]}", "email": "nobody@example.com", "groups": ["elsewhere"]}
    with pytest.raises(NoOrganisationError, match="no group the gateway maps to an organization"):
        stack.people.sign_in(claims, stack.identity)


def _all_refused(stack: Stack, key: str, *, tries: int = 6) -> list[int]:
    """Several requests on every node (so both workers of each serve some)."""
    statuses = []
    for url in stack.urls():
        for _ in range(tries):
            statuses.append(post(url, key, chat(HAIKU, 16)).status_code)
    return statuses


def test_a_disabled_persons_next_request_is_refused_on_every_worker_and_node(stack: Stack) -> None:
    grace, grace_key = stack.person("grace", "developers")
    assert set(_all_refused(stack, grace_key)) == {200}
    stack.people.set_disabled(grace.public_id, True)
    disabled_at = time.monotonic()
    statuses = _all_refused(stack, grace_key)
    assert time.monotonic() - disabled_at < 5  # every node answered (the refusals take no upstream call)
    assert set(statuses) == {401}, statuses
    response = post(stack.urls()[0], grace_key, chat(HAIKU, 16))
    assert "owner is disabled" in response.json()["error"]["message"]
    # enabled again: her key works again (it was not revoked)
    stack.people.set_disabled(grace.public_id, False)
    assert set(_all_refused(stack, grace_key, tries=2)) == {200}
    # disabled with her keys revoked: those keys never work again, even once she is enabled
    stack.people.set_disabled(grace.public_id, True, revoke_keys=True)
    stack.people.set_disabled(grace.public_id, False)
    assert set(_all_refused(stack, grace_key, tries=2)) == {401}
    revoked = post(stack.urls()[0], grace_key, chat(HAIKU, 16))
    assert "revoked" in revoked.json()["error"]["message"]


def test_a_group_losing_a_model_applies_at_the_members_next_request(stack: Stack) -> None:
    people = stack.people
    group = people.put_group("testers", org="eng", models=["claude-sonnet-*"])[1]
    heidi, heidi_key = stack.person("heidi", "testers")
    assert heidi.group_ids == (group.id,)
    assert post(stack.urls()[0], heidi_key, chat(SONNET)).status_code == 200
    people.put_group("testers", org="eng", models=["claude-haiku-*"])
    for url in stack.urls():
        assert post(url, heidi_key, chat(SONNET)).status_code == 403
        assert post(url, heidi_key, chat(HAIKU, 16)).status_code == 200
    people.delete_group("testers")


def test_a_persons_keys_share_their_rate_limit_and_a_teammate_has_their_own(stack: Stack) -> None:
    ivan, first_key = stack.person("ivan", "metered")
    _, second_key = stack.people.mint_key(ivan, hours=1, client="laptop")  # a second sign-in
    judy, judy_key = stack.person("judy", "metered")
    urls = cycle(stack.urls())
    statuses = [post(next(urls), key, chat(HAIKU, 16)).status_code for key in [first_key, second_key] * 3]
    assert statuses.count(200) == 4 and statuses.count(429) == 2, statuses  # 4 a minute, both keys together
    refused = post(next(urls), second_key, chat(HAIKU, 16))
    assert refused.status_code == 429
    message = refused.json()["error"]["message"]
    assert f"user {ivan.public_id} may send 4 requests per minute" in message, message
    assert post(next(urls), judy_key, chat(HAIKU, 16)).status_code == 200  # her own budget
    # her own cap, lower than her group's, applies from her next request (a new cap counts from
    # its own zero, as a key's does)
    stack.people.set_rate_limits(judy.public_id, rpm=1, tpm=None)
    assert post(next(urls), judy_key, chat(HAIKU, 16)).status_code == 200
    refused = post(next(urls), judy_key, chat(HAIKU, 16))
    assert refused.status_code == 429, refused.text
    assert f"user {judy.public_id} may send 1 requests per minute" in refused.json()["error"]["message"]
