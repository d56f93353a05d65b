"""The usage and cost reports under gunicorn (two gevent workers), read with the ``anthropic`` SDK's
``client.beta.organization.analytics`` (``usage_report``, ``cost_report``, ``usage``, ``cost``)
unchanged but for ``base_url`` and an admin key from ``admin-keys create``: after real requests
through the simulator (two workspaces, three keys, two models, cache writes and reads), every
report's sums, followed page by page by the SDK, equal what ``ezat-compat usage --json`` lists:
tokens exactly and cost to the micro-dollar (a ten-thousandth of a cent)."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import pytest
import requests

from tests.integration.conftest import standard_models
from tests.integration.harness import Gateway, Sim

pytestmark = pytest.mark.integration

SYSTEM = [{"type": "text", "text": "You answer briefly. " * 40, "cache_control": {"type": "ephemeral"}}]
KEYS = (("reports-a", "sonnet"), ("reports-a", "haiku"), ("reports-b", "sonnet"))
HELLO = [{"role": "user", "content": "hi"}]
MODELS = {"sonnet": "claude-sonnet-5-5", "haiku": "claude-haiku-4-5"}


@pytest.fixture(scope="module")
def served(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("reports-gateway")
    gateway = Gateway(root=root, models=standard_models(sim.url), workers=2, admin=True)
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def traffic(served: Gateway) -> list[dict[str, Any]]:
    """Requests of three keys in two workspaces on two models, some with cache writes and reads,
    one refused by the upstream's validation (billed nothing, still a request); then the ledger's
    rows as ``usage --json`` lists them."""
    for n, (org, model) in enumerate(KEYS):
        key = served.new_key(org)
        for turn in range(3 + n):
            body: dict[str, Any] = {
                "model": MODELS[model],
                "max_tokens": 20 + turn,
                "system": SYSTEM,
                "messages": [{"role": "user", "content": f"hello {turn}"}],
            }
            answer = requests.post(served.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
            assert answer.status_code == 200, answer.text
        chat: dict[str, Any] = {
            "model": MODELS[model],
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "hi"}],
        }
        answer = requests.post(
            served.url + "/openai/v1/chat/completions",
            json=chat,
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    rows = served.usage()
    assert len(rows) == sum(4 + n for n in range(len(KEYS)))
    assert sum(r["cache_write_tokens"] for r in rows) > 0 and sum(r["cache_read_tokens"] for r in rows) > 0
    return rows


@pytest.fixture(scope="module")
def client(served: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.admin_url, api_key=served.new_admin_key("--read-only"))


def _window() -> tuple[datetime, datetime]:
    """A range around now on whole hours (the reports' buckets)."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return now - timedelta(hours=2), now + timedelta(hours=2)


def _tokens(rows: list[dict[str, Any]]) -> Counter[str]:
    """What the reports sum, from ``usage --json``'s rows."""
    sums: Counter[str] = Counter()
    for row in rows:
        sums["requests"] += 1
        sums["uncached_input_tokens"] += row["input_tokens"]
        sums["cache_creation"] += row["cache_write_tokens"]
        sums["cache_read_input_tokens"] += row["cache_read_tokens"]
        sums["output_tokens"] += row["output_tokens"]
    return sums


def _cents(rows: list[dict[str, Any]]) -> Decimal:
    return sum((Decimal(row["cost_usd"]) * 100 for row in rows), Decimal(0))


def _add_usage(sums: Counter[str], result: Any) -> None:
    sums["requests"] += result.requests
    sums["uncached_input_tokens"] += result.uncached_input_tokens
    sums["cache_creation"] += result.cache_creation.ephemeral_5m_input_tokens
    sums["cache_creation"] += result.cache_creation.ephemeral_1h_input_tokens
    sums["cache_read_input_tokens"] += result.cache_read_input_tokens
    sums["output_tokens"] += result.output_tokens


def test_the_legacy_usage_report_sums_equal_usage_json(
    client: anthropic.Anthropic, traffic: list[dict[str, Any]]
) -> None:
    start, end = _window()
    buckets = list(
        client.beta.organization.analytics.usage_report.list(
            starting_at=start, ending_at=end, bucket_width="1h", group_by=["model"], limit=1
        )
    )  # one bucket a page: the SDK follows next_page
    assert [b.starting_at for b in buckets] == [start + timedelta(hours=h) for h in range(4)]
    sums: Counter[str] = Counter()
    by_model: Counter[str | None] = Counter()
    for bucket in buckets:
        for result in bucket.results:
            _add_usage(sums, result)
            by_model[result.model] += result.output_tokens
            assert result.server_tool_use.web_search_requests == 0
    assert sums == _tokens(traffic)
    expected: Counter[str | None] = Counter()
    for row in traffic:
        expected[row["canonical_model"]] += row["output_tokens"]
    assert by_model == expected


def test_the_legacy_cost_report_sums_equal_usage_json(
    client: anthropic.Anthropic, traffic: list[dict[str, Any]]
) -> None:
    start, end = _window()
    pages = client.beta.organization.analytics.cost_report.list(
        starting_at=start.isoformat().replace("+00:00", "Z"),
        ending_at=end,
        bucket_width="1d",
        group_by=["workspace_id", "api_key_id"],  # type: ignore[list-item]  # the gateway's extensions
    )
    results = [result for bucket in pages for result in bucket.results]
    assert {r.currency for r in results} == {"USD"}
    assert all(r.amount == r.list_amount for r in results)
    assert sum(Decimal(r.amount) for r in results) == _cents(traffic)
    per_key: dict[str, Decimal] = {}
    for result in results:
        assert result.workspace_id.startswith("wrkspc_")  # type: ignore[attr-defined]
        key = result.api_key_id  # type: ignore[attr-defined]
        per_key[key] = per_key.get(key, Decimal(0)) + Decimal(result.amount)
    expected: dict[str, Decimal] = {}
    for row in traffic:
        key = "apikey_" + row["key_id"].removeprefix("key_")
        expected[key] = expected.get(key, Decimal(0)) + Decimal(row["cost_usd"]) * 100
    assert per_key == expected


def test_the_usage_and_cost_reports_sum_equal_usage_json_page_by_page(
    client: anthropic.Anthropic, traffic: list[dict[str, Any]]
) -> None:
    start, end = _window()
    analytics = client.beta.organization.analytics
    rows = list(
        analytics.usage.list(
            starting_at=start,
            ending_at=end,
            time_bucket_width="1h",
            group_by=["api_key_id", "workspace_id", "model"],
            limit=2,
        )
    )
    sums: Counter[str] = Counter()
    per_workspace: Counter[str] = Counter()
    for row in rows:
        _add_usage(sums, row.usage)
        assert row.usage.total_tokens == (
            row.usage.uncached_input_tokens
            + row.usage.cache_creation.ephemeral_5m_input_tokens
            + row.usage.cache_read_input_tokens
            + row.usage.output_tokens
        )
        assert row.group.api_key_id is not None and row.group.workspace_id is not None and row.group.model
        per_workspace[row.group.workspace_id] += row.usage.requests or 0
    assert sums == _tokens(traffic)
    assert sorted(per_workspace.values()) == sorted(Counter(r["org"] for r in traffic).values())

    costs = list(analytics.cost.list(starting_at=start, ending_at=end, group_by=["model"], limit=1))
    assert sum(Decimal(c.cost.amount) for c in costs) == _cents(traffic)
    assert [Decimal(c.cost.amount) for c in costs] == sorted((Decimal(c.cost.amount) for c in costs), reverse=True)
    assert {c.group.model for c in costs} == {r["canonical_model"] for r in traffic}
    assert sum(c.cost.requests or 0 for c in costs) == len(traffic)


def test_rows_in_time_order_page_by_page_are_the_rows_of_one_page(
    client: anthropic.Anthropic, traffic: list[dict[str, Any]]
) -> None:
    start, end = _window()
    usage = client.beta.organization.analytics.usage

    def walk(limit: int, order: str) -> list[tuple[Any, ...]]:
        rows = usage.list(
            starting_at=start,
            ending_at=end,
            time_bucket_width="1m",
            group_by=["api_key_id", "model"],
            order_by="time",
            order=order,  # type: ignore[arg-type]
            limit=limit,
        )
        return [(r.starting_at, r.group.api_key_id, r.group.model, r.usage.total_tokens) for r in rows]

    for order in ("asc", "desc"):
        whole = walk(1000, order)
        assert len(whole) >= len(KEYS) and len(whole) == len({(r[0], r[1], r[2]) for r in whole})
        assert walk(1, order) == whole
        times = [row[0] for row in whole]
        assert times == sorted(times, reverse=order == "desc")


def test_the_workers_fold_new_requests_in_the_background(served: Gateway, traffic: list[dict[str, Any]]) -> None:
    """Without a report being asked, a worker's fold loop (started in ``post_worker_init``) folds
    the new ledger rows into the rollup within its round (5 s)."""
    key = served.new_key("reports-background")
    body: dict[str, Any] = {
        "model": "claude-sonnet-5-5",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    answer = requests.post(served.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
    assert answer.status_code == 200, answer.text
    database = sqlite3.connect(served.root / "ezat.db")
    try:
        head = database.execute("SELECT MAX(id) FROM ledger").fetchone()[0]
        deadline = time.monotonic() + 20
        while database.execute("SELECT folded_id FROM usage_rollup").fetchone()[0] < head:
            assert time.monotonic() < deadline, "no worker folded the new ledger row"
            time.sleep(0.2)
        (requests_folded,) = database.execute("SELECT SUM(requests) FROM usage_1d").fetchone()
    finally:
        database.close()
    assert requests_folded == len(served.usage())


def test_filters_and_what_the_gateway_does_not_track(
    client: anthropic.Anthropic, traffic: list[dict[str, Any]]
) -> None:
    start, end = _window()
    analytics = client.beta.organization.analytics
    key = traffic[0]["key_id"]
    mine = [r for r in traffic if r["key_id"] == key]
    (only,) = list(analytics.usage.list(starting_at=start, ending_at=end, api_key_ids=["apikey_" + key[4:]]))
    assert only.usage.requests == len(mine)
    assert only.starting_at == start and only.ending_at == end
    with pytest.raises(anthropic.BadRequestError) as refused:
        list(analytics.usage.list(starting_at=start, ending_at=end, group_by=["product"]))
    assert refused.value.status_code == 400 and "product" in refused.value.message
    with pytest.raises(anthropic.BadRequestError):
        list(analytics.cost_report.list(starting_at=start, group_by=["token_type"]))
