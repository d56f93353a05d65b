"""Accounts, billing and rate limits through the real gateway under gunicorn.

Every test runs against three stacks, each a gateway with two gevent workers in front of the
simulator: SQLite with the embedded limit counters (the default), PostgreSQL (a fresh schema)
with the embedded counters, and PostgreSQL with Redis for the limits (the scale-out setup).
The money checks read the org and key rows straight from the database; the ledger is read
through ``ezat-compat usage``. Chat Completions reference, "Errors" (402, 403, 429, failed requests
aren't billed), "Streaming" (usage recorded before ``[DONE]``).

Which worker answered is read from gunicorn's access log (``%(p)s``, the worker's pid, next
to the ``request-id`` response header), so "from every worker" is checked, not hoped for.
``test_a_request_never_costs_more_than_its_reservation`` is an expected failure (strict) until
``translate/estimate.py`` counts the keys of JSON objects: see its reason.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
import redis
import requests
from sqlalchemy import Engine, create_engine, select

from ezat_compat.app import embedded_limits_path
from ezat_compat.catalog import Catalog
from ezat_compat.config import load_config
from ezat_compat.domain import Model, Usage
from ezat_compat.pricing import cost_micros, micros_to_usd, usd_to_micros, worst_case_micros
from ezat_compat.store.accounts import hash_key
from ezat_compat.store.tables import api_keys, orgs
from ezat_compat.translate.estimate import input_tokens_upper_bound
from ezat_compat.translate.request import openai_to_anthropic
from ezat_compat.wire.openai import load_chat_request
from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, Sim
from tests.support.stacks import postgres_schema

pytestmark = pytest.mark.integration

MODEL = "anthropic/claude-sonnet-5-5"
CHAT = "/openai/v1/chat/completions"
MESSAGES = "/v1/messages"
NATIVE_HI = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
REDIS_DB = 13  # a database number no other suite uses; flushed before and after
ACCESS_FORMAT = "%(p)s %({request-id}o)s %(s)s"
STACKS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("postgresql+redis", id="postgresql+redis", marks=[pytest.mark.postgres, pytest.mark.redis]),
]


# ---------------------------------------------------------------- the stacks


@dataclass
class Stack:
    """One gateway (2 workers) and a read-only view of its database."""

    kind: str
    gateway: Gateway
    engine: Engine
    database_url: str
    redis: redis.Redis | None = None
    names: Iterator[int] = field(default_factory=lambda: iter(range(1, 10_000)))

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def access_log(self) -> Path:
        return self.gateway.root / "access.log"

    def org_name(self, label: str) -> str:
        """A fresh organisation name: every test gets its own org, so its sums are its own."""
        return f"{label}-{next(self.names)}"

    def new_key(self, org: str, *key_args: str, balance: str = "100") -> str:
        return self.gateway.new_key(org, *key_args, balance=balance)

    def org(self, name: str) -> dict[str, int]:
        with self.engine.connect() as conn:
            row = conn.execute(select(orgs.c.balance_micros, orgs.c.reserved_micros).where(orgs.c.name == name)).one()
        return {"balance": row.balance_micros, "reserved": row.reserved_micros}

    def key(self, secret: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(
                    api_keys.c.public_id,
                    api_keys.c.spent_micros,
                    api_keys.c.reserved_micros,
                    api_keys.c.spend_limit_micros,
                ).where(api_keys.c.key_hash == hash_key(secret))
            ).one()
        return {
            "id": row.public_id,
            "spent": row.spent_micros,
            "reserved": row.reserved_micros,
            "limit": row.spend_limit_micros,
        }

    def workers_of(self, request_ids: list[str], timeout_s: float = 5) -> dict[str, str]:
        """request id -> pid of the worker that answered it (from the access log)."""
        wanted = set(request_ids)
        deadline = time.monotonic() + timeout_s
        found: dict[str, str] = {}
        while True:
            if self.access_log.exists():
                for line in self.access_log.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 3 and parts[1] in wanted:
                        found[parts[1]] = parts[0]
            if len(found) == len(wanted) or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The gateway of one stack. Its database and Redis URLs are pinned in the environment too
    (``EZAT_DATABASE_URL``, ``EZAT_REDIS_URL`` override the file), so a runner's own settings
    can't redirect it; the schema, the Redis database and the counter file go away at the end."""
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"billing-{kind.replace('+', '-')}")
    database_url = f"sqlite:///{(root / 'ezat.db').as_posix()}"
    redis_url = ""
    redis_client: redis.Redis | None = None
    with ExitStack() as cleanup:
        if kind.startswith("postgresql"):
            database_url = postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_it")
            counters = embedded_limits_path(database_url, str(root))
            for suffix in ("", "-wal", "-shm"):
                cleanup.callback(Path(counters + suffix).unlink, missing_ok=True)
        if kind.endswith("+redis"):
            redis_url = urlsplit(request.getfixturevalue("redis_url"))._replace(path=f"/{REDIS_DB}").geturl()
            redis_client = redis.Redis.from_url(redis_url)
            cleanup.callback(redis_client.close)
            cleanup.callback(redis_client.flushdb)
            redis_client.flushdb()
        gateway = Gateway(
            root=root,
            models=standard_models(sim.url),
            workers=2,
            gateway_settings={
                "keepalive_s": 1,
                "database_url": database_url,
                "redis_url": redis_url,
                "cooldown_failures": 1000,
            },  # failures here test billing only
            env={
                "EZAT_DATABASE_URL": database_url,
                "EZAT_REDIS_URL": redis_url,
                "EZAT_ACCESS_LOG": str(root / "access.log"),
                "GUNICORN_CMD_ARGS": f"--access-logformat '{ACCESS_FORMAT}'",
            },
        )
        cleanup.callback(gateway.stop)
        gateway.start()
        engine = create_engine(database_url)
        cleanup.callback(engine.dispose)
        yield Stack(kind=kind, gateway=gateway, engine=engine, database_url=database_url, redis=redis_client)


@pytest.fixture(scope="module")
def model(stack: Stack) -> Model:
    found = Catalog(load_config(stack.gateway.config_path).models).resolve(MODEL)
    assert found is not None
    return found


# ---------------------------------------------------------------- requests


def chat(text: str, max_tokens: int = 64, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **extra}


def post(
    stack: Stack,
    key: str,
    body: dict[str, Any],
    *,
    path: str = CHAT,
    close: bool = False,
    session: requests.Session | None = None,
) -> requests.Response:
    headers = {"authorization": f"Bearer {key}"}
    if close:
        headers["connection"] = "close"
    return (session or requests).post(stack.url + path, json=body, headers=headers, timeout=60)


def parallel(stack: Stack, key: str, bodies: list[dict[str, Any]], path: str = CHAT) -> list[requests.Response]:
    """Send every body at once, one thread and one pooled session per request, released together."""
    barrier = threading.Barrier(len(bodies))

    def one(body: dict[str, Any]) -> requests.Response:
        with requests.Session() as session:
            barrier.wait(timeout=30)
            return post(stack, key, body, path=path, session=session)

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(one, bodies))


def sequential_from_every_worker(
    stack: Stack, send: Callable[[], requests.Response], least: int = 20, most: int = 200
) -> list[requests.Response]:
    """At least ``least`` requests, one after the other on fresh connections, and more (10 at a
    time) until both workers have answered some."""
    answers = [send() for _ in range(least)]
    while len(set(stack.workers_of([r.headers["request-id"] for r in answers]).values())) < 2:
        assert len(answers) < most, "one worker answered every request"
        answers += [send() for _ in range(10)]
    return answers


def worst_case(model: Model, body: dict[str, Any]) -> int:
    """The reservation the gateway makes for an OpenAI body (pipeline.Gateway.admit)."""
    translated = openai_to_anthropic(load_chat_request(body), model, auto_cache=True).body
    return worst_case_micros(
        input_tokens_upper_bound(translated, model.context_window), translated["max_tokens"], model.price
    )


def ledger_cost(row: dict[str, Any], model: Model) -> int:
    """``pricing.cost_micros`` of a ledger row's figures, checked against the harness's prices
    (USD per million tokens = micro-USD per token: input 3, cache write 3.75, cache read 0.30,
    output 15, thinking included in output), rounded half-up."""
    usage = Usage(
        input_tokens=row["input_tokens"],
        cache_write_tokens=row["cache_write_tokens"],
        cache_read_tokens=row["cache_read_tokens"],
        output_tokens=row["output_tokens"],
        reasoning_tokens=row["reasoning_tokens"],
    )
    by_hand = (
        Decimal(3) * usage.input_tokens
        + Decimal("3.75") * usage.cache_write_tokens
        + Decimal("0.30") * usage.cache_read_tokens
        + Decimal(15) * usage.output_tokens
    )
    cost = cost_micros(usage, model.price)
    assert cost == int(by_hand.quantize(Decimal(1), rounding=ROUND_HALF_UP)), (row, cost, by_hand)
    return cost


def openai_error(resp: requests.Response, status: int, type_: str, code: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == (type_, code), error
    return error


def anthropic_error(resp: requests.Response, status: int, type_: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == type_, body
    return body["error"]


def assert_retry_after(resp: requests.Response) -> int:
    value = resp.headers.get("retry-after", "")
    assert re.fullmatch(r"[1-9][0-9]*", value), f"retry-after {value!r} is not a whole number of seconds"
    assert int(value) <= 60
    return int(value)


# ---------------------------------------------------------------- 402: balance and spend limit under load


WORDS = "[[sim:delay=1,words=2000]] Write a long essay."
MAX_TOKENS = 1000


class Sampler:
    """Polls the org and key rows while requests run; every sample must keep the invariants."""

    def __init__(self, stack: Stack, org: str, secret: str) -> None:
        self.stack, self.org, self.secret = stack, org, secret
        self.samples: list[tuple[dict[str, int], dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((self.stack.org(self.org), self.stack.key(self.secret)))
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.mark.parametrize("limit", ["balance", "spend_limit"])
def test_200_concurrent_requests_never_overshoot(stack: Stack, model: Model, limit: str) -> None:
    body = chat(WORDS, MAX_TOKENS)
    worst = worst_case(model, body)
    budget = 100 * worst
    org = stack.org_name(f"load-{limit.replace('_', '-')}")
    if limit == "balance":
        key = stack.new_key(org, balance=micros_to_usd(budget))
    else:
        key = stack.new_key(org, "--spend-limit", micros_to_usd(budget), balance="1000")
    start = stack.org(org)["balance"]

    with Sampler(stack, org, key) as sampler:
        answers = parallel(stack, key, [body] * 200)

    by_status = Counter(r.status_code for r in answers)
    assert set(by_status) <= {200, 402}, {r.status_code: r.text for r in answers if r.status_code not in (200, 402)}
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 402]
    rows = stack.gateway.usage("--org", org)
    # Each request costs at most its worst case, so at least 100 fit; each costs at least its real
    # cost (output = max_tokens), so not all 200 do.
    real = min(usd_to_micros(row["cost_usd"]) for row in rows)
    assert 100 <= len(ok) <= budget // real < 200, by_status
    for r in refused:
        error = openai_error(r, 402, "insufficient_quota", "insufficient_quota")
        assert f"may cost up to ${micros_to_usd(worst)}" in error["message"], error["message"]
        if limit == "balance":
            assert "Insufficient balance" in error["message"] and f"organization '{org}'" in error["message"]
        else:
            assert "spend limit" in error["message"]

    # Never below zero, never more held than there is, at every sample; and they did overlap.
    assert max(org_row["reserved"] for org_row, _ in sampler.samples) >= 10 * worst
    for org_row, key_row in sampler.samples:
        assert org_row["balance"] >= 0 and org_row["reserved"] >= 0
        assert org_row["reserved"] <= org_row["balance"]
        if limit == "spend_limit":
            assert key_row["spent"] + key_row["reserved"] <= budget

    # The ledger: one row per answered request, none for the refused ones, and it sums to the debits.
    ids = [row["request_id"] for row in rows]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(r.headers["request-id"] for r in ok)
    assert {row["status"] for row in rows} == {200}
    total = sum(usd_to_micros(row["cost_usd"]) for row in rows)
    for row in rows:
        assert usd_to_micros(row["cost_usd"]) == ledger_cost(row, model)
        assert row["output_tokens"] == MAX_TOKENS and not row["estimated"]
    after_org, after_key = stack.org(org), stack.key(key)
    assert after_org["reserved"] == 0 and after_key["reserved"] == 0
    assert after_org["balance"] == start - total >= 0
    assert after_key["spent"] == total
    listed = json.loads(stack.gateway.cli("keys", "list", "--org", org, "--json").stdout)
    assert [k["spent_usd"] for k in listed] == [micros_to_usd(total)]
    if limit == "spend_limit":
        assert total <= budget and listed[0]["spend_limit_usd"] == micros_to_usd(budget)


def test_the_reservation_is_the_worst_case_and_is_released(stack: Stack, model: Model) -> None:
    """Measured while a slow request runs: the org and key hold exactly the documented worst case."""
    org = stack.org_name("reserve")
    key = stack.new_key(org, "--spend-limit", "50", balance="10")
    body = chat("[[sim:delay=1]] Hello there.", 500)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(post, stack, key, body)
        deadline = time.monotonic() + 5
        while stack.org(org)["reserved"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        held_org, held_key = stack.org(org)["reserved"], stack.key(key)["reserved"]
        resp = pending.result()
    assert resp.status_code == 200, resp.text
    assert held_org == held_key == worst_case(model, body)
    assert stack.org(org)["reserved"] == 0 and stack.key(key)["reserved"] == 0


def test_failed_and_refused_requests_cost_nothing(stack: Stack, model: Model) -> None:
    org = stack.org_name("failed")
    key = stack.new_key(org, balance="10")
    start = stack.org(org)["balance"]
    upstream_500 = post(stack, key, chat("[[sim:status=500]] fail"))
    assert upstream_500.status_code == 500, upstream_500.text
    bad = post(stack, key, chat("hi", max_tokens=999_999))
    assert bad.status_code == 400, bad.text
    paid = post(stack, key, chat("hi", max_tokens=60_000))
    assert paid.status_code == 200, paid.text
    rows = {row["request_id"]: row for row in stack.gateway.usage("--org", org)}
    failed = rows[upstream_500.headers["request-id"]]
    assert failed["status"] == 500 and failed["cost_usd"] == "0.000000" and failed["output_tokens"] == 0
    # Refused by validation before admission: no row (or, if one is written, a free one).
    assert rows.pop(bad.headers["request-id"], {"cost_usd": "0.000000"})["cost_usd"] == "0.000000"
    assert set(rows) == {upstream_500.headers["request-id"], paid.headers["request-id"]}
    cost = usd_to_micros(rows[paid.headers["request-id"]]["cost_usd"])
    assert cost == ledger_cost(rows[paid.headers["request-id"]], model) > 0
    assert stack.org(org) == {"balance": start - cost, "reserved": 0}


@pytest.mark.parametrize("marker", ["cut=6", "error_after=2"])
def test_a_stream_that_fails_midway_costs_nothing(stack: Stack, marker: str) -> None:
    org = stack.org_name("broken")
    key = stack.new_key(org, balance="10")
    text = f"[[sim:{marker},words=200]] Go on."
    openai_stream = requests.post(
        stack.url + CHAT,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
        json={**chat(text, 1000), "stream": True, "stream_options": {"include_usage": True}},
    )
    assert openai_stream.status_code == 200
    assert '"error"' in openai_stream.text and "usage" not in openai_stream.text.split('"error"')[-1]
    native_stream = requests.post(
        stack.url + MESSAGES,
        headers={"x-api-key": key},
        timeout=30,
        json={**NATIVE_HI, "max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": text}]},
    )
    assert native_stream.status_code == 200 and "message_stop" not in native_stream.text
    rows = {row["request_id"]: row for row in stack.gateway.usage("--org", org)}
    assert set(rows) == {openai_stream.headers["request-id"], native_stream.headers["request-id"]}
    for row in rows.values():
        assert row["status"] >= 500 and row["cost_usd"] == "0.000000", row
    assert stack.org(org) == {"balance": usd_to_micros("10"), "reserved": 0}
    assert stack.key(key)["spent"] == 0 and stack.key(key)["reserved"] == 0


def test_a_request_that_cannot_fit_is_refused_with_402_on_both_endpoints(stack: Stack, model: Model) -> None:
    org = stack.org_name("poor")
    key = stack.new_key(org, balance="0.01")
    body = chat("hi", 10_000)  # worst case ≈ $0.15 > $0.01
    resp = post(stack, key, body)
    error = openai_error(resp, 402, "insufficient_quota", "insufficient_quota")
    assert error["message"].startswith(
        f"Insufficient balance: this request may cost up to ${micros_to_usd(worst_case(model, body))}"
    ), error["message"]
    assert "$0.010000 available" in error["message"]
    streamed = post(stack, key, {**body, "stream": True})  # refused before any stream starts
    assert streamed.headers["content-type"].startswith("application/json")
    openai_error(streamed, 402, "insufficient_quota", "insufficient_quota")
    native = post(
        stack,
        key,
        {"model": MODEL, "max_tokens": 10_000, "messages": [{"role": "user", "content": "hi"}]},
        path=MESSAGES,
    )
    assert "Insufficient balance" in anthropic_error(native, 402, "billing_error")["message"]
    assert post(stack, key, chat("hi", 100)).status_code == 200
    assert stack.gateway.cli("orgs", "top-up", org, "1").stdout.strip().startswith(f"organization {org}: balance $1.0")
    assert post(stack, key, body).status_code == 200
    rows = stack.gateway.usage("--org", org)
    assert [row["status"] for row in rows] == [200, 200]
    spent = sum(usd_to_micros(row["cost_usd"]) for row in rows)
    assert stack.org(org) == {"balance": usd_to_micros("1.01") - spent, "reserved": 0}


# A tool schema whose size is in its keys (property names), not its values.
FORM_PROPERTIES = {f"field_number_{i:03d}_with_a_rather_long_descriptive_name": {} for i in range(300)}


@pytest.mark.parametrize("endpoint", ["openai", "anthropic"])
def test_a_request_never_costs_more_than_its_reservation(stack: Stack, model: Model, endpoint: str) -> None:
    """The worst case must bound the real cost, or concurrent requests overdraw the balance
    (the rule: neither the balance nor a key's spend limit is ever exceeded)."""
    org = stack.org_name(f"bound-{endpoint}")
    schema = {"type": "object", "properties": FORM_PROPERTIES, "description": str(uuid.uuid4())}  # uncached
    if endpoint == "openai":
        body = chat("hi", 16, tools=[{"type": "function", "function": {"name": "fill_form", "parameters": schema}}])
        worst, path = worst_case(model, body), CHAT
    else:
        body = {**NATIVE_HI, "tools": [{"name": "fill_form", "input_schema": schema}]}
        worst = worst_case_micros(input_tokens_upper_bound(body, model.context_window), body["max_tokens"], model.price)
        path = MESSAGES
    key = stack.new_key(org, "--spend-limit", micros_to_usd(worst), balance=micros_to_usd(worst))
    resp = post(stack, key, body, path=path)
    assert resp.status_code == 200, resp.text
    (row,) = stack.gateway.usage("--org", org)
    assert usd_to_micros(row["cost_usd"]) <= worst, (row, worst)
    assert stack.org(org)["balance"] >= 0 and stack.key(key)["spent"] <= worst


# ---------------------------------------------------------------- 429: rpm and tpm across workers


def test_rpm_10_admits_exactly_10_of_30_parallel_requests(stack: Stack) -> None:
    org = stack.org_name("rpm")
    key = stack.new_key(org, "--rpm", "10")
    answers = parallel(stack, key, [chat("[[sim:delay=0.2]] hi", 16)] * 30)
    by_status = Counter(r.status_code for r in answers)
    assert by_status == {200: 10, 429: 20}, {r.status_code: r.text for r in answers}
    for r in answers:
        if r.status_code == 429:
            error = openai_error(r, 429, "rate_limit_error", "rate_limit_exceeded")
            assert "requests per minute (10)" in error["message"]
            assert_retry_after(r)
    workers = stack.workers_of([r.headers["request-id"] for r in answers])
    assert len(workers) == 30 and len(set(workers.values())) == 2, "both workers must have answered"
    # The refused ones are not in the ledger; the native endpoint shares the same counter.
    rows = stack.gateway.usage("--org", org)
    assert sorted(row["request_id"] for row in rows) == sorted(
        r.headers["request-id"] for r in answers if r.status_code == 200
    )
    native = post(stack, key, NATIVE_HI, path=MESSAGES)
    anthropic_error(native, 429, "rate_limit_error")
    assert_retry_after(native)
    if stack.redis is not None:
        assert stack.redis.keys("*"), "the limits must be counted in Redis when redis_url is set"
        assert not Path(embedded_limits_path(stack.database_url, str(stack.gateway.root))).exists()


def tokens_reserved(model: Model, body: dict[str, Any]) -> int:
    """The tokens the gateway reserves for an OpenAI body: its input bound plus max_tokens."""
    translated = openai_to_anthropic(load_chat_request(body), model, auto_cache=True).body
    return input_tokens_upper_bound(translated, model.context_window) + int(translated["max_tokens"])


def within_one_clock_minute(need_s: float = 30.0) -> None:
    """Wait for the next clock minute unless ``need_s`` seconds are left of this one: the tpm
    counters' windows are aligned to the clock (``limits.RateLimits._tpm_key``), so a test whose
    requests must share one minute's counter starts early enough in a minute to end in it."""
    left = 60.0 - time.time() % 60.0
    if left < need_s:
        time.sleep(left + 0.05)


def test_tpm_refuses_the_next_request_once_the_tokens_are_used(stack: Stack) -> None:
    org = stack.org_name("tpm")
    key = stack.new_key(org, "--tpm", "3000")
    within_one_clock_minute()
    model = load_config(stack.gateway.config_path).models[0]
    first = post(stack, key, chat("[[sim:words=200]] Tell me a story.", 250))
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["total_tokens"]
    assert used > 200
    left = 3000 - used  # the first request's reservation was settled to what it used
    hi_bound = tokens_reserved(model, chat("hi", 1)) - 1
    second_body = chat("hi", left + 1 - hi_bound)  # it would fit an empty minute, not what is left of this one
    second = post(stack, key, second_body)
    error = openai_error(second, 429, "rate_limit_error", "rate_limit_exceeded")
    assert "tokens per minute (3000)" in error["message"] and f"{left} of its 3000 tokens left" in error["message"]
    assert_retry_after(second)
    streamed = requests.post(
        stack.url + CHAT,
        json={**second_body, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    openai_error(streamed, 429, "rate_limit_error", "rate_limit_exceeded")
    assert post(stack, key, chat("hi", left - hi_bound)).status_code == 200  # exactly what is left still fits
    too_large = post(stack, key, chat("hi", 3001 - hi_bound))
    assert openai_error(too_large, 429, "rate_limit_error", "rate_limit_exceeded")["message"].startswith(
        "Request too large for tokens per minute (3000)"
    )
    other = stack.new_key(org)  # another key of the same org is not limited
    assert post(stack, other, chat("hi", 16)).status_code == 200


def test_tpm_2000_never_admits_more_tokens_than_the_limit_under_60_parallel_requests(stack: Stack) -> None:
    """The tokens are reserved at admission (input bound + max_tokens) by an atomic counter
    shared by both workers (and nodes, on Redis): the admitted reservations, and so the tokens
    really used, stay within the limit however the requests race."""
    org = stack.org_name("tpm-race")
    key = stack.new_key(org, "--tpm", "2000")
    body = chat("[[sim:delay=0.3,words=60]] Tell me a story.", 60)
    reserved = tokens_reserved(load_config(stack.gateway.config_path).models[0], body)
    answers = parallel(stack, key, [body] * 60)
    by_status = Counter(r.status_code for r in answers)
    admitted = [r for r in answers if r.status_code == 200]
    used = sum(r.json()["usage"]["total_tokens"] for r in admitted)
    assert set(by_status) == {200, 429}, {r.status_code: r.text for r in answers}
    # Each admission held ``reserved`` tokens until its request settled to what it used: at no
    # moment were more than 2000 held or used, so the minute's real count is within the limit.
    assert used <= 2000, (used, by_status, reserved)
    print(f"tpm 2000 [{stack.kind}]: {len(admitted)} of 60 admitted ({reserved} reserved each), {used} tokens used")
    workers = stack.workers_of([r.headers["request-id"] for r in answers])
    assert len(set(workers.values())) == 2, "both workers must have answered"


# ---------------------------------------------------------------- 401 / 403 at once, from every worker


def test_revoked_and_expired_keys_are_refused_at_once_by_every_worker(stack: Stack) -> None:
    org = stack.org_name("revoke")
    revoked = stack.new_key(org)
    expires = datetime.now(UTC) + timedelta(days=1)  # made to pass below: no race with a slow CLI start
    expiring = stack.gateway.cli("keys", "create", "--org", org, "--expires", expires.isoformat()).stdout.split()[-1]
    # Both keys have been used by both workers (any cache would now hold them).
    for secret in (expiring, revoked):
        warm = sequential_from_every_worker(stack, lambda s=secret: post(stack, s, chat("hi", 8), close=True), least=4)
        assert {r.status_code for r in warm} == {200}, [r.text for r in warm]

    stack.gateway.cli("keys", "revoke", stack.key(revoked)["id"])
    answers = sequential_from_every_worker(stack, lambda: post(stack, revoked, chat("hi", 8), close=True))
    for r in answers:
        assert (
            openai_error(r, 401, "invalid_request_error", "invalid_api_key")["message"]
            == "This API key has been revoked."
        )
    assert len(set(stack.workers_of([r.headers["request-id"] for r in answers]).values())) == 2

    with stack.engine.begin() as conn:  # the day passes
        conn.execute(
            api_keys.update()
            .where(api_keys.c.key_hash == hash_key(expiring))
            .values(expires_at=datetime.now(UTC) - timedelta(minutes=1))
        )
    answers = sequential_from_every_worker(stack, lambda: post(stack, expiring, chat("hi", 8), close=True))
    for r in answers:
        assert (
            openai_error(r, 401, "invalid_request_error", "invalid_api_key")["message"] == "This API key has expired."
        )
    assert len(set(stack.workers_of([r.headers["request-id"] for r in answers]).values())) == 2
    for secret in (revoked, expiring):
        native = post(stack, secret, NATIVE_HI, path=MESSAGES)
        anthropic_error(native, 401, "authentication_error")
    rows = stack.gateway.usage("--org", org)
    assert rows and {row["status"] for row in rows} == {200}, "refused requests leave no ledger row"


def test_a_suspended_org_is_refused_for_all_its_keys_until_resumed(stack: Stack) -> None:
    org = stack.org_name("suspend")
    keys = [stack.new_key(org), stack.new_key(org)]
    bystander = stack.new_key(stack.org_name("bystander"))
    assert all(post(stack, k, chat("hi", 8)).status_code == 200 for k in keys)
    stack.gateway.cli("orgs", "suspend", org)
    for k in keys:
        answers = sequential_from_every_worker(stack, lambda k=k: post(stack, k, chat("hi", 8), close=True), least=10)
        for r in answers:
            error = openai_error(r, 403, "permission_error", None)
            assert error["message"] == f"The organization '{org}' is suspended; ask your administrator to resume it."
        native = post(stack, k, NATIVE_HI, path=MESSAGES)
        anthropic_error(native, 403, "permission_error")
    assert post(stack, bystander, chat("hi", 8)).status_code == 200
    stack.gateway.cli("orgs", "resume", org)
    for k in keys:
        answers = sequential_from_every_worker(stack, lambda k=k: post(stack, k, chat("hi", 8), close=True), least=4)
        assert {r.status_code for r in answers} == {200}


def test_a_key_limited_to_some_models_gets_403_for_the_others(stack: Stack) -> None:
    org = stack.org_name("models")
    key = stack.new_key(org, "--models", "anthropic/claude-haiku-*")
    refused = post(stack, key, chat("hi", 8))
    error = openai_error(refused, 403, "permission_error", None)
    assert error["param"] == "model" and MODEL in error["message"]
    anthropic_error(post(stack, key, NATIVE_HI, path=MESSAGES), 403, "permission_error")
    allowed = post(stack, key, {**chat("hi", 8), "model": "claude-haiku-4-5"})
    assert allowed.status_code == 200, allowed.text
    rows = stack.gateway.usage("--org", org)
    assert [row["request_id"] for row in rows] == [allowed.headers["request-id"]]
    assert rows[0]["canonical_model"] == "anthropic/claude-haiku-4-5"


# ---------------------------------------------------------------- usage: what the clients received


SYSTEM = "You are a careful assistant who answers in plain words. " * 12  # ~170 tokens: cacheable


def _openai_figures(usage: Any) -> dict[str, int]:
    return {
        "prompt": usage.prompt_tokens,
        "completion": usage.completion_tokens,
        "cached": usage.prompt_tokens_details.cached_tokens,
        "reasoning": usage.completion_tokens_details.reasoning_tokens,
    }


def _anthropic_figures(usage: Any) -> dict[str, int]:
    details = usage.output_tokens_details
    return {
        "input": usage.input_tokens,
        "cache_write": usage.cache_creation_input_tokens or 0,
        "cache_read": usage.cache_read_input_tokens or 0,
        "output": usage.output_tokens,
        "reasoning": details.thinking_tokens if details is not None else 0,
    }


def test_usage_shows_what_the_clients_received(stack: Stack, model: Model) -> None:
    org = stack.org_name("usage")
    key = stack.new_key(org, balance="100")
    oa = openai.OpenAI(base_url=stack.url + "/openai/v1", api_key=key, max_retries=0)
    an = anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0)
    received: dict[str, tuple[str, dict[str, int]]] = {}
    # The simulator's prompt cache outlives a stack: a system prompt of this test's own.
    system = f"{uuid.uuid4()} {SYSTEM}"
    native_system = [{"type": "text", "text": "Natively: " + system, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "What is a ledger?"}]

    for _ in range(2):  # the second one reads the prompt cache the first one wrote
        raw = oa.chat.completions.with_raw_response.create(model=MODEL, max_tokens=64, messages=messages)
        received[raw.headers["request-id"]] = ("openai", _openai_figures(raw.parse().usage))
    raw_stream = oa.chat.completions.with_raw_response.create(
        model="claude-sonnet-5.5",
        max_tokens=2048,
        reasoning_effort="low",
        stream=True,
        stream_options={"include_usage": True},
        messages=[*messages[:1], {"role": "user", "content": "[[sim:thinking_tokens=40]] Think, then answer."}],
    )
    chunks = list(raw_stream.parse())
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    received[raw_stream.headers["request-id"]] = ("openai", _openai_figures(chunks[-1].usage))

    native_messages = [{"role": "user", "content": "[[sim:thinking_tokens=30]] What is a ledger?"}]
    raw_native = an.messages.with_raw_response.create(
        model=MODEL, max_tokens=256, system=native_system, messages=native_messages
    )
    received[raw_native.headers["request-id"]] = ("anthropic", _anthropic_figures(raw_native.parse().usage))
    with an.messages.stream(
        model="claude-sonnet-5-5", max_tokens=256, messages=native_messages, system=native_system
    ) as s:
        final = s.get_final_message()
        rid = s.response.headers["request-id"]
    received[rid] = ("anthropic", _anthropic_figures(final.usage))

    rows = {row["request_id"]: row for row in stack.gateway.usage("--org", org)}
    assert set(rows) == set(received)
    for rid, (dialect, figures) in received.items():
        row = rows[rid]
        assert row["status"] == 200 and not row["estimated"] and row["deployment"] == "sim-a"
        assert row["canonical_model"] == MODEL and row["org"] == org
        if dialect == "openai":
            assert row["endpoint"] == "chat.completions"
            assert figures == {
                "prompt": row["input_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"],
                "completion": row["output_tokens"],
                "cached": row["cache_read_tokens"],
                "reasoning": row["reasoning_tokens"],
            }, row
        else:
            assert row["endpoint"] == "messages"
            assert figures == {
                "input": row["input_tokens"],
                "cache_write": row["cache_write_tokens"],
                "cache_read": row["cache_read_tokens"],
                "output": row["output_tokens"],
                "reasoning": row["reasoning_tokens"],
            }, row
        assert usd_to_micros(row["cost_usd"]) == ledger_cost(row, model)
    models_sent = sorted(row["model"] for row in rows.values())
    assert models_sent == sorted([MODEL, MODEL, "claude-sonnet-5.5", MODEL, "claude-sonnet-5-5"])
    # The run exercised every figure: cache writes and reads, reasoning, on both endpoints.
    for endpoint in ("chat.completions", "messages"):
        mine = [row for row in rows.values() if row["endpoint"] == endpoint]
        for name in ("cache_write_tokens", "cache_read_tokens", "reasoning_tokens"):
            assert any(row[name] for row in mine), (endpoint, name)

    # The table for people sums the rows per org, key and model.
    table = stack.gateway.cli("usage", "--org", org).stdout.splitlines()
    header = table[0].split()
    assert header == [
        "ORG",
        "KEY",
        "MODEL",
        "REQUESTS",
        "INPUT",
        "CACHE_WRITE",
        "CACHE_READ",
        "OUTPUT",
        "REASONING",
        "COST_USD",
    ]
    (line,) = table[2:]
    shown = dict(zip(header, line.split(), strict=True))
    sums: dict[str, int] = defaultdict(int)
    for row in rows.values():
        for name in ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens", "reasoning_tokens"):
            sums[name] += row[name]
    assert shown == {
        "ORG": org,
        "KEY": stack.key(key)["id"],
        "MODEL": MODEL,
        "REQUESTS": str(len(rows)),
        "INPUT": str(sums["input_tokens"]),
        "CACHE_WRITE": str(sums["cache_write_tokens"]),
        "CACHE_READ": str(sums["cache_read_tokens"]),
        "OUTPUT": str(sums["output_tokens"]),
        "REASONING": str(sums["reasoning_tokens"]),
        "COST_USD": micros_to_usd(sum(usd_to_micros(row["cost_usd"]) for row in rows.values())),
    }
    total = sum(usd_to_micros(row["cost_usd"]) for row in rows.values())
    assert stack.org(org) == {"balance": usd_to_micros("100") - total, "reserved": 0}
    by_key = stack.gateway.usage("--key", stack.key(key)["id"])
    assert [row["request_id"] for row in by_key] == list(rows)
    third = by_key[2]["created_at"]
    assert [row["request_id"] for row in stack.gateway.usage("--org", org, "--since", third)] == list(rows)[2:]


def close_early_and_wait(stack: Stack, org: str, resp: requests.Response, *, lines: int) -> dict[str, Any]:
    """Read ``lines`` lines of a stream, hang up, and wait for its ledger row."""
    assert resp.status_code == 200
    it = resp.iter_lines()
    for _ in range(lines):
        next(it)
    resp.close()
    rid = resp.headers["request-id"]
    deadline = time.monotonic() + 10
    rows: dict[str, Any] = {}
    while rid not in rows and time.monotonic() < deadline:
        time.sleep(0.2)
        rows = {row["request_id"]: row for row in stack.gateway.usage("--org", org)}
    return rows[rid]


def test_a_stream_closed_early_is_billed_as_estimated_and_releases_its_reservation(stack: Stack, model: Model) -> None:
    org = stack.org_name("early")
    key = stack.new_key(org, balance="10")
    resp = requests.post(
        stack.url + CHAT,
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=30,
        json={**chat("[[sim:words=400,token_delay_ms=50]] Go on.", 1000), "stream": True},
    )
    row = close_early_and_wait(stack, org, resp, lines=6)
    assert row["status"] == 499 and row["estimated"] is True and row["output_tokens"] > 0
    assert usd_to_micros(row["cost_usd"]) == ledger_cost(row, model) > 0
    assert stack.org(org) == {"balance": usd_to_micros("10") - usd_to_micros(row["cost_usd"]), "reserved": 0}


def test_a_native_stream_closed_early_is_billed_as_estimated(stack: Stack, model: Model) -> None:
    org = stack.org_name("early-native")
    key = stack.new_key(org, balance="10")
    body = {
        "model": MODEL,
        "max_tokens": 1000,
        "stream": True,
        "messages": [{"role": "user", "content": "[[sim:words=400,token_delay_ms=50]] Go on."}],
    }
    resp = requests.post(
        stack.url + MESSAGES,
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json=body,
        stream=True,
        timeout=30,
    )
    row = close_early_and_wait(stack, org, resp, lines=12)
    assert row["status"] == 499 and row["estimated"] is True and row["endpoint"] == "messages"
    assert row["input_tokens"] > 0 and 0 < row["output_tokens"] < 1000
    assert usd_to_micros(row["cost_usd"]) == ledger_cost(row, model) > 0
    assert stack.org(org) == {"balance": usd_to_micros("10") - usd_to_micros(row["cost_usd"]), "reserved": 0}
