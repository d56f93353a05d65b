"""Spend limits by period through the real gateway (gunicorn, two gevent workers a node): a monthly
cap on a key and a daily one on its organisation hold under 200 concurrent requests, the next
request is a 402 naming the cap in each dialect's envelope, the webhook gets each threshold once
(signed), the gauges show, and the ``anthropic`` SDK's spend-limit resources manage it all.

Two stacks: SQLite with one node, and PostgreSQL with Redis and two nodes (two gunicorn masters
on one database), requests spread over both."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import cycle
from typing import Any

import anthropic
import pytest
import requests
from sqlalchemy import Engine, create_engine, select

from ezat_compat.alerts import verify
from ezat_compat.catalog import Catalog
from ezat_compat.config import load_config
from ezat_compat.domain import Model
from ezat_compat.periods import MICROS_PER_CENT
from ezat_compat.pricing import micros_to_usd, usd_to_micros, worst_case_micros
from ezat_compat.store.accounts import api_key_id, hash_key
from ezat_compat.store.spend import REFRESH_S
from ezat_compat.store.tables import api_keys, orgs, spend_counters, spend_limits
from ezat_compat.translate.estimate import input_tokens_upper_bound
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.wire.openai import load_chat_request
from tests.integration.conftest import standard_models
from tests.integration.harness import Sim
from tests.support.spend_limits import HookReceiver, TabledGateway
from tests.support.stacks import flushed_redis, postgres_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "anthropic/claude-sonnet-5-5"
CHAT = "/openai/v1/chat/completions"
MESSAGES = "/v1/messages"
# Output fills max_tokens, which makes most of the worst case: the spend comes close to each cap.
WORDS = "[[sim:delay=0.3,words=6000]] Write a long essay."
MAX_TOKENS = 4000
SECRET = "whsec-spend-tests"
REDIS_DB = 11  # a database number no other suite uses; flushed before and after
STACKS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql+redis", id="postgresql+redis-two-nodes", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


@dataclass
class Stack:
    nodes: list[TabledGateway]
    engine: Engine
    hook: HookReceiver
    names: Iterator[int] = field(default_factory=lambda: iter(range(1, 10_000)))

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def cli(self, *args: str) -> str:
        return self.nodes[0].cli(*args).stdout

    def key_id(self, secret: str) -> str:
        with self.engine.connect() as conn:
            return str(
                conn.execute(select(api_keys.c.public_id).where(api_keys.c.key_hash == hash_key(secret))).scalar()
            )

    def workspace_id(self, org: str) -> str:
        with self.engine.connect() as conn:
            return str(conn.execute(select(orgs.c.public_id).where(orgs.c.name == org)).scalar())

    def counters(self) -> dict[str, tuple[int, int]]:
        """spl_… -> (spent, reserved) of its periods, summed (one period each in these tests)."""
        query = select(spend_limits.c.public_id, spend_counters.c.spent_micros, spend_counters.c.reserved_micros).join(
            spend_counters, spend_counters.c.limit_id == spend_limits.c.id
        )
        found: dict[str, tuple[int, int]] = {}
        with self.engine.connect() as conn:
            for public_id, spent, reserved in conn.execute(query):
                before = found.get(public_id, (0, 0))
                found[public_id] = (before[0] + spent, before[1] + reserved)
        return found


def _tables(hook_url: str) -> str:
    return (
        '[admin]\nbind = ""\non_main_listener = true\n\n'
        f'[alerts]\nwebhook_url = "{hook_url}"\nevery_s = 0.5\nthresholds = [80, 100]\n'
    )


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"spend-{kind.replace('+', '-')}")
    database_url = f"sqlite:///{(root / 'ezat.db').as_posix()}"
    redis_url = ""
    with ExitStack() as cleanup:
        hook = HookReceiver().start()
        cleanup.callback(hook.stop)
        if kind.startswith("postgresql"):
            database_url = postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_spend")
            redis_url = flushed_redis(cleanup, request.getfixturevalue("redis_url"), REDIS_DB)
        nodes = []
        for n in range(2 if redis_url else 1):
            node = TabledGateway(
                root=root / f"node-{n}",
                models=standard_models(sim.url),
                workers=2,
                gateway_settings={"keepalive_s": 1, "database_url": database_url, "redis_url": redis_url},
                env={
                    "EZAT_DATABASE_URL": database_url,
                    "EZAT_REDIS_URL": redis_url,
                    "EZAT_ADMIN_BIND": "",
                    "EZAT_ALERTS_WEBHOOK_SECRET": SECRET,
                },
                tables=_tables(hook.url),
            )
            cleanup.callback(node.stop)
            nodes.append(node.start())
        engine = create_engine(database_url)
        cleanup.callback(engine.dispose)
        yield Stack(nodes=nodes, engine=engine, hook=hook)


@pytest.fixture(scope="module")
def model(stack: Stack) -> Model:
    found = Catalog(load_config(stack.nodes[0].config_path).models).resolve(MODEL)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def admin(stack: Stack) -> anthropic.Anthropic:
    """The ``anthropic`` SDK on the gateway's admin API, unchanged but for ``base_url`` and the key."""
    secret = stack.cli("admin-keys", "create", "--name", "spend-tests").strip().splitlines()[-1]
    assert secret.startswith("ezat_admin_"), secret
    return anthropic.Anthropic(api_key=secret, base_url=stack.url, max_retries=0)


def admin_key_id(stack: Stack) -> str:
    """The id (``adminkey_…``) of the admin key the ``admin`` fixture made."""
    keys = json.loads(stack.cli("admin-keys", "list", "--json"))
    return str(next(k["id"] for k in keys if k["name"] == "spend-tests"))


def chat(text_: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text_}]}


def worst_case(model: Model, body: dict[str, Any]) -> int:
    """The reservation the gateway makes for an OpenAI body (pipeline.Gateway.admit)."""
    translated = openai_to_anthropic(load_chat_request(body), model, auto_cache=True).body
    return worst_case_micros(
        input_tokens_upper_bound(translated, model.context_window), translated["max_tokens"], model.price
    )


def post(url: str, key: str, body: dict[str, Any], path: str = CHAT) -> requests.Response:
    headers = {"authorization": f"Bearer {key}"} if path == CHAT else {"x-api-key": key}
    with requests.Session() as session:
        return session.post(url + path, json=body, headers=headers, timeout=60)


def burst(stack: Stack, jobs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, requests.Response]]:
    """Every (key, body) at once, spread over the nodes, released together."""
    barrier = threading.Barrier(len(jobs))
    urls = cycle([node.url for node in stack.nodes])
    planned = [(next(urls), key, body) for key, body in jobs]

    def one(job: tuple[str, str, dict[str, Any]]) -> tuple[str, requests.Response]:
        barrier.wait(timeout=30)
        return job[1], post(job[0], job[1], job[2])

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(one, planned))


class Sampler:
    """Reads the counters while requests run: spent + held never passes a cap, at any sample."""

    def __init__(self, stack: Stack, caps: dict[str, int]) -> None:
        self.stack, self.caps = stack, caps
        self.samples: list[dict[str, tuple[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.stack.counters())
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sample in self.samples:
            for limit_id, cap in self.caps.items():
                spent, held = sample.get(limit_id, (0, 0))
                assert spent >= 0 and held >= 0 and spent + held <= cap, (limit_id, spent, held, cap)


def until_refused(stack: Stack, key: str, body: dict[str, Any], most: int = 10) -> requests.Response:
    """Requests one after the other until one is refused (402); that one."""
    for _ in range(most):
        answer = post(stack.url, key, body)
        if answer.status_code == 402:
            return answer
        assert answer.status_code == 200, answer.text
    raise AssertionError(f"{most} requests in a row passed the cap")


def cents_of(micros: int) -> int:
    return -(-micros // MICROS_PER_CENT)


def test_caps_hold_under_200_concurrent_requests_and_alert_once(
    stack: Stack, model: Model, admin: anthropic.Anthropic
) -> None:
    body = chat(WORDS)
    worst = worst_case(model, body)
    org = f"capped-{next(stack.names)}"
    capped = stack.nodes[0].new_key(org, balance="1000")
    other = stack.nodes[0].new_key(org, balance="1000")
    key_cap = cents_of(12 * worst) * MICROS_PER_CENT
    org_cap = cents_of(40 * worst) * MICROS_PER_CENT
    key_limit = admin.beta.organization.spend_limits.set(
        amount=str(key_cap // MICROS_PER_CENT),
        scope={"type": "api_key", "api_key_id": api_key_id(stack.key_id(capped))},  # type: ignore[arg-type, misc]
        period="monthly",
    )
    org_limit = admin.beta.organization.spend_limits.set(
        amount=str(org_cap // MICROS_PER_CENT),
        scope={"type": "workspace", "workspace_id": stack.workspace_id(org)},
        period="daily",
    )
    time.sleep(REFRESH_S + 0.2)  # every worker of every node has seen them
    caps = {key_limit.id: key_cap, org_limit.id: org_cap}

    with Sampler(stack, caps):
        first = burst(stack, [(capped, body)] * 100)  # the key's monthly cap binds
        key_refusal = until_refused(stack, capped, body)
        second = burst(stack, [(capped, body)] * 100 + [(other, body)] * 100)  # the org's daily cap binds
        org_refusal = until_refused(stack, other, body)

    statuses = Counter(r.status_code for _, r in first + second)
    assert set(statuses) == {200, 402}, {
        r.status_code: r.text for _, r in first + second if r.status_code not in (200, 402)
    }
    assert all(r.status_code == 402 for key, r in second if key == capped)
    rows = stack.nodes[0].usage("--org", org)
    spent_by_key = Counter[str]()
    for row in rows:
        spent_by_key[row["key_id"]] += usd_to_micros(row["cost_usd"])
    assert 0 < spent_by_key[stack.key_id(capped)] <= key_cap
    assert 0 < sum(spent_by_key.values()) <= org_cap
    assert spent_by_key[stack.key_id(capped)] > key_cap - worst  # filled: not even one more fits
    assert sum(spent_by_key.values()) > org_cap - worst
    counters = stack.counters()
    assert counters[key_limit.id] == (spent_by_key[stack.key_id(capped)], 0)  # nothing held any more
    assert counters[org_limit.id] == (sum(spent_by_key.values()), 0)

    # The next request: a 402 naming the cap, its amount and when it resets, in each dialect's envelope.
    error = key_refusal.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert (
        f"the monthly spend limit of key {stack.key_id(capped)} (${micros_to_usd(key_cap)} a month, {key_limit.id})"
        in error["message"]
    )
    assert re.search(r"it resets at \d{4}-\d\d-01T00:00:00Z\.", error["message"]), error["message"]
    error = org_refusal.json()["error"]
    assert (
        f"the daily spend limit of organization '{org}' (${micros_to_usd(org_cap)} a day, {org_limit.id})"
        in error["message"]
    )
    native = post(stack.url, other, {**chat(WORDS), "stream": True}, path=MESSAGES)
    assert native.status_code == 402 and native.json()["type"] == "error"
    assert native.json()["error"]["type"] == "billing_error" and org_limit.id in native.json()["error"]["message"]

    # The webhook: each threshold of each limit once, signed; more rounds change nothing.
    wanted = {(key_limit.id, 80), (key_limit.id, 100), (org_limit.id, 80), (org_limit.id, 100)}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(stack.hook.bodies()) < len(wanted):
        time.sleep(0.1)
    time.sleep(2)  # several more rounds of every worker's loop
    received = stack.hook.bodies()
    alerts = [json.loads(body) for _, body in received]
    fired = [(a["spend_limit"]["id"], a["threshold"]) for a in alerts if a["spend_limit"]["id"] in caps]
    assert sorted(fired) == sorted(wanted), alerts
    for headers, payload in received:
        assert verify(SECRET, headers, payload, now=time.time())
    reasons = {(a["spend_limit"]["id"], a["threshold"]): a["reason"] for a in alerts}
    assert reasons[(key_limit.id, 100)] == "refused" and reasons[(key_limit.id, 80)] == "spent"

    # The gauges, on whichever worker answers the scrape.
    metrics = requests.get(stack.url + "/metrics", timeout=10).text
    ratio = re.search(
        rf'ezat_spend_limit_ratio\{{period="monthly",scope="key",scope_id="{stack.key_id(capped)}"\}} ([0-9.e-]+)',
        metrics,
    )
    assert ratio is not None and 0.8 <= float(ratio.group(1)) <= 1.0, metrics
    assert f'ezat_spend_limit_usd{{kind="cap",period="daily",scope="org",scope_id="{org}"}} {org_cap / 1e6}' in metrics


def test_the_sdk_sets_lists_retrieves_and_deletes_and_reads_the_effective_limits(
    stack: Stack, admin: anthropic.Anthropic
) -> None:
    org = f"sdk-{next(stack.names)}"
    secret = stack.nodes[0].new_key(org, balance="10")
    workspace = stack.workspace_id(org)
    key = api_key_id(stack.key_id(secret))
    limits = admin.beta.organization.spend_limits
    made = limits.set(amount="50000", scope={"type": "workspace", "workspace_id": workspace}, period="weekly")
    assert made.id.startswith("spl_") and made.amount == "50000" and made.currency == "USD"
    assert made.scope.type == "workspace" and made.scope.workspace_id == workspace  # type: ignore[union-attr]
    overwritten = limits.set(amount=None, scope={"type": "workspace", "workspace_id": workspace}, period="weekly")
    assert overwritten.id == made.id and overwritten.amount is None
    on_key = limits.set(amount="700", scope={"type": "api_key", "api_key_id": key}, period="daily")  # type: ignore[arg-type, misc]

    listed = list(limits.list(scope_type=["workspace"], limit=1))  # the SDK follows next_page
    assert made.id in [s.id for s in listed] and {s.scope.type for s in listed} == {"workspace"}
    assert limits.retrieve(on_key.id).amount == "700"

    effective = list(admin.organization.spend_limits.effective.list(period=["daily", "weekly"]))
    mine = [row for row in effective if row.actor.scoped_api_key_id == key]  # type: ignore[union-attr]
    assert [(row.period, row.spend_limit_id, row.amount) for row in mine] == [
        ("daily", on_key.id, "700"),
        ("weekly", made.id, None),
    ]
    assert mine[0].period_to_date_spend == "0" and mine[0].currency == "USD"
    assert mine[1].source.type == "workspace"

    deleted = limits.delete(on_key.id)
    assert (deleted.id, deleted.type) == (on_key.id, "spend_limit_deleted")
    with pytest.raises(anthropic.NotFoundError):
        limits.retrieve(on_key.id)
    limits.delete(made.id)
    trail = json.loads(stack.cli("audit", "list", "--json"))
    actions = [(e["action"], e["target"]["id"]) for e in trail]
    assert {e["actor"] for e in trail if e["action"].startswith("spend_limit.")} == {admin_key_id(stack)}
    assert all(e["request_id"] and e["address"] for e in trail if e["action"].startswith("spend_limit."))
    for action, target in [
        ("spend_limit.create", made.id),
        ("spend_limit.update", made.id),
        ("spend_limit.create", on_key.id),
        ("spend_limit.delete", on_key.id),
    ]:
        assert (action, target) in actions, actions
