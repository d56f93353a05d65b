"""The spend limits' admin API (admin/spend.py) and CLI (``spend-limits``) in one process: the
wire shapes of Anthropic's Admin API, the extensions, the errors, the audit trail, and the
threshold loop (ezat_compat/alerts.py) against a fake webhook — a signed POST per threshold and
period, retried with backoff, at most once across two loops; the gauges.

The same endpoints through gunicorn with the ``anthropic`` SDK, and the caps under load, are in
tests/integration/test_spend_limits_gateway.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ezat_compat.alerts import SIGNATURE_HEADER, TIMESTAMP_HEADER, SpendAlerts, crossings, gauges, verify
from ezat_compat.app import create_app
from ezat_compat.config import parse_config
from ezat_compat.domain import AlertsSettings, Config
from ezat_compat.errors import InsufficientQuotaError
from ezat_compat.server.metrics import Metrics
from ezat_compat.store.accounts import AuthContext, api_key_id
from ezat_compat.store.db import migrate
from ezat_compat.store.spend import SCOPE_KEY, SCOPE_ORG, SpendLimits
from ezat_compat.store.store import Store, open_store
from tests.support.stores import entry

pytestmark = pytest.mark.integration

USD = 1_000_000
SECRET = "whsec-test"


def _config(tmp_path: Path, **alerts: Any) -> Config:
    data = {
        "gateway": {"database_url": f"sqlite:///{tmp_path / 'ezat.db'}", "data_dir": str(tmp_path)},
        "admin": {"bind": "", "on_main_listener": True},
        "alerts": {"webhook_url": "http://127.0.0.1:9/hook", **alerts},
        "models": [
            {
                "id": "anthropic/m",
                "aliases": [],
                "price": {"input": 3, "output": 15},
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9", "upstream_model": "u"}],
            }
        ],
    }
    return parse_config(data, path=str(tmp_path / "ezat.toml"), environ={"EZAT_ALERTS_WEBHOOK_SECRET": SECRET})


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return _config(tmp_path)


@pytest.fixture
def store(config: Config) -> Iterator[Store]:
    from ezat_compat.store.db import make_engine

    engine = make_engine(config.gateway.database_url)
    migrate(engine)
    engine.dispose()
    opened = open_store(config.gateway.database_url, config=config)
    yield opened
    opened.close()


@pytest.fixture
def app(config: Config, store: Store) -> Flask:
    return create_app(config, store=store)


@pytest.fixture
def admin_key(store: Store) -> str:
    assert store.admin is not None
    _, secret = store.admin.create_key(name="tests", created_by="cli:tests")
    return secret


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def ctx(store: Store) -> AuthContext:
    store.accounts.create_org("acme", 1000 * USD)
    _, secret = store.accounts.create_key("acme")
    return store.accounts.authenticate(secret, datetime.now(UTC))


def call(client: FlaskClient, key: str, method: str, path: str, **kwargs: Any) -> Any:
    return client.open("/v1/organizations" + path, method=method, headers={"authorization": f"Bearer {key}"}, **kwargs)


# ---------------------------------------------------------------- the wire shapes


def test_set_retrieve_list_and_delete_in_the_admin_apis_shapes(
    client: FlaskClient, admin_key: str, store: Store, ctx: AuthContext
) -> None:
    org = store.accounts.get_org("acme")
    made = call(
        client,
        admin_key,
        "POST",
        "/spend_limits",
        json={"amount": "50000", "scope": {"type": "workspace", "workspace_id": org.public_id}, "period": "monthly"},
    )
    assert made.status_code == 200, made.get_json()
    limit = made.get_json()
    assert limit["id"].startswith("spl_") and limit["type"] == "spend_limit"
    assert limit["scope"] == {"type": "workspace", "workspace_id": org.public_id}
    assert (limit["amount"], limit["currency"], limit["period"], limit["is_enabled"]) == (
        "50000",
        "USD",
        "monthly",
        True,
    )
    assert limit["thresholds"] == [80, 100]
    assert limit["created_at"].endswith("Z") and limit["updated_at"] == limit["created_at"]

    again = call(
        client,
        admin_key,
        "POST",
        "/spend_limits",
        json={"amount": None, "scope": {"type": "workspace", "workspace_id": "acme"}, "period": "monthly"},
    ).get_json()
    assert again["id"] == limit["id"] and again["amount"] is None  # an upsert on (scope, period)

    key_limit = call(
        client,
        admin_key,
        "POST",
        "/spend_limits",
        json={"amount": "1000", "scope": {"type": "api_key", "api_key_id": api_key_id(ctx.key_public_id)},
              "period": "daily", "thresholds": [50, 90]},
    ).get_json()  # fmt: skip
    assert key_limit["scope"] == {"type": "api_key", "api_key_id": api_key_id(ctx.key_public_id)}
    assert key_limit["thresholds"] == [50, 90]
    gateway = call(
        client, admin_key, "POST", "/spend_limits", json={"amount": "9999", "scope": {"type": "organization"}}
    )
    assert gateway.get_json()["period"] == "monthly" and gateway.get_json()["scope"] == {"type": "organization"}

    listed = call(client, admin_key, "GET", "/spend_limits?limit=2").get_json()
    assert [s["scope"]["type"] for s in listed["data"]] == ["organization", "workspace"]
    assert listed["has_more"] is True and listed["next_page"]
    rest = call(client, admin_key, "GET", f"/spend_limits?limit=2&page={listed['next_page']}").get_json()
    assert [s["id"] for s in rest["data"]] == [key_limit["id"]] and rest["next_page"] is None
    only_keys = call(client, admin_key, "GET", "/spend_limits?scope_type[]=api_key").get_json()
    assert [s["id"] for s in only_keys["data"]] == [key_limit["id"]]
    of_workspace = call(client, admin_key, "GET", f"/spend_limits?workspace_id={org.public_id}").get_json()
    assert {s["id"] for s in of_workspace["data"]} == {limit["id"], key_limit["id"]}

    assert call(client, admin_key, "GET", f"/spend_limits/{key_limit['id']}").get_json() == key_limit
    deleted = call(client, admin_key, "DELETE", f"/spend_limits/{key_limit['id']}")
    assert deleted.get_json() == {"id": key_limit["id"], "type": "spend_limit_deleted"}
    gone = call(client, admin_key, "GET", f"/spend_limits/{key_limit['id']}")
    assert gone.status_code == 404 and gone.get_json()["error"]["type"] == "not_found_error"

    trail = [(e.action, e.target_id) for e in store.admin.entries()] if store.admin else []
    assert ("spend_limit.create", limit["id"]) in trail
    assert ("spend_limit.update", limit["id"]) in trail
    assert ("spend_limit.delete", key_limit["id"]) in trail


@pytest.mark.parametrize(
    ("body", "wording"),
    [
        ({"scope": {"type": "organization"}}, "amount"),
        ({"amount": "12.5", "scope": {"type": "organization"}}, "integer number of cents"),
        ({"amount": "-1", "scope": {"type": "organization"}}, "integer number of cents"),
        ({"amount": "100", "scope": {"type": "organization"}, "period": "yearly"}, "period"),
        ({"amount": "100", "scope": {"type": "seat_tier", "seat_tier": "standard"}}, "scope: must be"),
        ({"amount": "100", "scope": {"type": "user"}}, "scope: must be"),
        ({"amount": "100", "scope": {"type": "workspace"}}, "scope: must be"),
        ({"amount": "100", "scope": {"type": "organization"}, "thresholds": [0]}, "thresholds"),
        ({"amount": "100", "scope": {"type": "organization"}, "colour": "red"}, "colour"),
    ],
)
def test_set_refuses_bad_bodies_with_a_400_naming_the_field(
    client: FlaskClient, admin_key: str, body: dict[str, Any], wording: str
) -> None:
    answer = call(client, admin_key, "POST", "/spend_limits", json=body)
    assert answer.status_code == 400, answer.get_json()
    error = answer.get_json()["error"]
    assert error["type"] == "invalid_request_error" and wording in error["message"], error


def test_unknown_scopes_and_reads_of_scope_types_that_dont_apply(client: FlaskClient, admin_key: str) -> None:
    missing = call(
        client,
        admin_key,
        "POST",
        "/spend_limits",
        json={"amount": "1", "scope": {"type": "workspace", "workspace_id": "wrkspc_nope"}},
    )
    assert missing.status_code == 404
    assert call(client, admin_key, "GET", "/spend_limits?scope_type[]=seat_tier").status_code == 400
    assert call(client, admin_key, "GET", "/spend_limits?scope_type[]=user").status_code == 200
    assert call(client, admin_key, "GET", "/spend_limits/effective?user_ids[]=user_1").status_code == 404  # nobody


def test_writes_need_a_read_write_admin_key_and_inference_keys_never_pass(
    client: FlaskClient, store: Store, ctx: AuthContext
) -> None:
    assert store.admin is not None
    _, read_only = store.admin.create_key(name="ro", read_only=True, created_by="cli:tests")
    body = {"amount": "1", "scope": {"type": "organization"}}
    assert call(client, read_only, "POST", "/spend_limits", json=body).status_code == 403
    assert call(client, read_only, "GET", "/spend_limits").status_code == 200
    _, inference = store.accounts.create_key("acme")
    assert call(client, inference, "GET", "/spend_limits").status_code == 403
    assert call(client, "nope", "GET", "/spend_limits").status_code == 401


def test_effective_limits_per_key_name_the_binding_limit_and_the_keys_spend(
    client: FlaskClient, admin_key: str, store: Store, ctx: AuthContext
) -> None:
    spend = store.spend
    assert spend is not None
    now = datetime.now(UTC)
    _, org_daily = spend.set_limit(SCOPE_ORG, ctx.org_id, "daily", 5 * USD)
    _, key_daily = spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 50 * USD)
    _, key_monthly = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 100 * USD)
    store.accounts.create_key("acme")  # no limit of its own: the org's binds
    store.ledger.reserve(ctx, "r1", 2 * USD, now=now)
    store.ledger.settle("r1", entry(ctx, 1_234_567, created_at=now))

    rows = call(client, admin_key, "GET", "/spend_limits/effective").get_json()
    mine = [r for r in rows["data"] if r["actor"]["scoped_api_key_id"] == api_key_id(ctx.key_public_id)]
    assert [(r["period"], r["spend_limit_id"], r["amount"]) for r in mine] == [
        ("daily", org_daily.public_id, "500"),  # 5 USD left at most beats the key's 50
        ("monthly", key_monthly.public_id, "10000"),
    ]
    assert mine[0]["source"] == {"type": "workspace", "workspace_id": org_daily.workspace_id}
    assert mine[0]["scope"] == {"type": "api_key", "api_key_id": api_key_id(ctx.key_public_id)}
    assert mine[0]["actor"] == {"type": "scoped_api_key_actor", "scoped_api_key_id": api_key_id(ctx.key_public_id)}
    assert mine[0]["period_to_date_spend"] == mine[1]["period_to_date_spend"] == "123.456"  # cents, 3 decimals
    assert mine[0]["currency"] == "USD"
    other = [r for r in rows["data"] if r["actor"]["scoped_api_key_id"] != api_key_id(ctx.key_public_id)]
    assert [(r["period"], r["spend_limit_id"], r["period_to_date_spend"]) for r in other] == [
        ("daily", org_daily.public_id, "0")
    ]
    monthly_only = call(
        client,
        admin_key,
        "GET",
        f"/spend_limits/effective?period[]=monthly&api_key_ids[]={api_key_id(ctx.key_public_id)}",
    ).get_json()
    assert [r["spend_limit_id"] for r in monthly_only["data"]] == [key_monthly.public_id]
    paged = call(client, admin_key, "GET", "/spend_limits/effective?limit=1").get_json()
    assert paged["next_page"] and len({r["actor"]["scoped_api_key_id"] for r in paged["data"]}) == 1
    assert key_daily.public_id  # set, but not binding


# ---------------------------------------------------------------- the CLI


def test_the_cli_sets_lists_and_deletes_audited_as_the_unix_user(
    config: Config, store: Store, ctx: AuthContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ezat_compat.cli import main

    config_path = Path(config.path)
    config_path.write_text(
        f'[gateway]\ndatabase_url = "{config.gateway.database_url}"\n[spend]\ntime_zone = "Asia/Tokyo"\n'
        '[[models]]\nid = "anthropic/m"\naliases = []\nprice = { input = 3, output = 15 }\n'
        '[[models.deployments]]\nname = "d"\nbase_url = "http://127.0.0.1:9"\nupstream_model = "u"\n'
    )
    base = ["--config", str(config_path), "spend-limits"]
    assert main([*base, "set", "--scope", "org:acme", "--period", "weekly", "--usd", "200"]) == 0
    assert "org:acme weekly 200.000000 USD" in capsys.readouterr().out
    assert main([*base, "set", "--scope", f"key:{ctx.key_public_id}", "--period", "daily", "--usd", "none",
                 "--thresholds", "50,90"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main([*base, "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["scope"], r["period"], r["amount_usd"], r["thresholds"]) for r in rows] == [
        ("org:acme", "weekly", "200.000000", None),
        (f"key:{ctx.key_public_id}", "daily", None, [50, 90]),
    ]
    assert rows[0]["resets_at"].endswith("+09:00") is False  # RFC 3339 in UTC…
    start = datetime.fromisoformat(rows[0]["period_start"].replace("Z", "+00:00"))
    assert start.astimezone(UTC).hour == 15 and start.weekday() == 6  # …of Monday 00:00 in Tokyo
    assert main([*base, "set", "--scope", "org:nope", "--period", "daily", "--usd", "1"]) == 1
    assert "nope" in capsys.readouterr().err
    assert main([*base, "set", "--scope", "org:acme", "--period", "daily", "--usd", "1.234"]) == 1
    assert "whole number of cents" in capsys.readouterr().err
    assert main([*base, "delete", rows[0]["id"]]) == 0
    assert main([*base, "delete", rows[0]["id"]]) == 1
    assert store.admin is not None
    trail = [(e.actor, e.action) for e in store.admin.entries()]
    assert sum(1 for actor, action in trail if actor.startswith("cli:") and action.startswith("spend_limit.")) == 3


# ---------------------------------------------------------------- thresholds, webhooks, gauges


class FakeHook:
    """The webhook's receiver: answers from ``statuses`` in turn (then 200), keeps what came."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[tuple[dict[str, str], bytes]] = []

    def __call__(self, url: str, *, data: bytes, headers: dict[str, str], timeout: float) -> Any:
        self.received.append((headers, data))

        class Answer:
            status_code = self.statuses.pop(0) if self.statuses else 200

            def close(self) -> None:
                pass

        return Answer()


def test_each_threshold_fires_once_per_period_across_loops_signed(
    store: Store, ctx: AuthContext, config: Config
) -> None:
    spend = store.spend
    assert spend is not None
    _, limit = spend.set_limit(SCOPE_KEY, ctx.key_id, "monthly", 10 * USD)
    hook = FakeHook()
    published: list[Any] = []
    now = datetime.now(UTC)
    worker_a = SpendAlerts(spend, config.alerts, published.append, post=hook, sleep=lambda s: None)
    worker_b = SpendAlerts(SpendLimits(store.engine), config.alerts, None, post=hook, sleep=lambda s: None)

    store.ledger.reserve(ctx, "a", 8 * USD, now=now)
    assert worker_a.round() == [] and worker_b.round() == []  # held is not spent
    store.ledger.settle("a", entry(ctx, 8 * USD, created_at=now))
    won = worker_a.round() + worker_b.round()
    for thread in worker_a.deliveries + worker_b.deliveries:
        thread.join(5)
    assert [(c.threshold, c.reason) for c in won] == [(80, "spent")]
    assert worker_a.round() == [] and worker_b.round() == []  # claimed: never again this period

    # 100 %: the spend stops short of the cap, the next request that would fit an empty period is refused.
    with pytest.raises(InsufficientQuotaError):
        store.ledger.reserve(ctx, "b", 3 * USD, now=now)
    won = worker_b.round() + worker_a.round()
    for thread in worker_a.deliveries + worker_b.deliveries:
        thread.join(5)
    assert [(c.threshold, c.reason) for c in won] == [(100, "refused")]

    assert len(hook.received) == 2
    bodies = [json.loads(body) for _, body in hook.received]
    assert [(b["threshold"], b["reason"], b["spent_usd"]) for b in bodies] == [
        (80, "spent", "8.000000"),
        (100, "refused", "8.000000"),
    ]
    assert (
        bodies[0]["spend_limit"]["id"] == limit.public_id
        and bodies[0]["spend_limit"]["scope"] == f"key:{ctx.key_public_id}"
    )
    assert bodies[0]["type"] == "spend_limit.threshold_reached" and bodies[0]["ratio"] == 0.8
    for headers, body in hook.received:
        assert headers[SIGNATURE_HEADER].startswith("sha256=")
        assert verify(SECRET, headers, body, now=float(headers[TIMESTAMP_HEADER]))
        assert not verify("other secret", headers, body, now=float(headers[TIMESTAMP_HEADER]))
        assert not verify(SECRET, headers, body + b" ", now=float(headers[TIMESTAMP_HEADER]))
        assert not verify(SECRET, headers, body, now=float(headers[TIMESTAMP_HEADER]) + 3600)  # replayed later

    [reading] = published[-1]
    assert (reading.scope, reading.scope_id, reading.period, reading.cap_micros, reading.spent_micros) == (
        "key", ctx.key_public_id, "monthly", 10 * USD, 8 * USD
    )  # fmt: skip


def test_a_failing_webhook_is_retried_with_growing_waits_then_recorded(
    store: Store, ctx: AuthContext, config: Config
) -> None:
    spend = store.spend
    assert spend is not None
    spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 1 * USD, thresholds=[50])
    now = datetime.now(UTC)
    store.ledger.reserve(ctx, "a", USD, now=now)
    store.ledger.settle("a", entry(ctx, USD // 2, created_at=now))
    hook = FakeHook([500, 503, 502])
    waits: list[float] = []
    alerts = SpendAlerts(spend, config.alerts, None, post=hook, sleep=waits.append, first_backoff_s=1.0)
    [crossing] = alerts.round()
    for thread in alerts.deliveries:
        thread.join(5)
    assert waits == [1.0, 2.0, 4.0] and len(hook.received) == 4
    assert len({body for _, body in hook.received}) == 1  # the same alert (its id) every time
    from sqlalchemy import select

    from ezat_compat.store.tables import spend_alerts

    with store.engine.connect() as conn:
        row = conn.execute(select(spend_alerts)).one()
    assert row.attempts == 4 and row.delivered_at is not None and crossing.threshold == 50


def test_no_secret_no_webhook_and_no_url_no_claims_but_gauges(tmp_path: Path, store: Store, ctx: AuthContext) -> None:
    spend = store.spend
    assert spend is not None
    spend.set_limit(SCOPE_KEY, ctx.key_id, "daily", 1 * USD, thresholds=[1])
    store.ledger.reserve(ctx, "a", USD, now=datetime.now(UTC))
    store.ledger.settle("a", entry(ctx, USD, created_at=datetime.now(UTC)))
    hook = FakeHook()
    published: list[Any] = []
    unsigned = AlertsSettings(webhook_url="http://127.0.0.1:9/hook", webhook_secret="")
    assert SpendAlerts(spend, unsigned, published.append, post=hook).round() == []
    assert SpendAlerts(spend, AlertsSettings(), published.append, post=hook).round() == []
    assert hook.received == [] and len(published) == 2 and published[0][0].ratio == 1.0
    assert spend.claimed_alerts([1], [datetime.now(UTC)]) == set()


def test_thresholds_reached_by_spend_or_by_a_refusal() -> None:
    from ezat_compat.store.spend import PeriodSpend, SpendLimitInfo

    start = datetime(2026, 1, 1, tzinfo=UTC)

    def limit(amount: int | None, thresholds: tuple[int, ...] | None = None, id_: int = 1) -> SpendLimitInfo:
        return SpendLimitInfo(
            id_, f"spl_{id_}", "org", 1, "acme", 1, "wrkspc_1", "monthly", amount, thresholds, start, start
        )

    def period(spent: int, exhausted: bool = False) -> PeriodSpend:
        return PeriodSpend(start, start + timedelta(days=31), spent, 0, exhausted)

    def reached(
        lim: SpendLimitInfo, per: PeriodSpend, claimed: frozenset[tuple[int, int]] = frozenset()
    ) -> list[tuple[int, str]]:
        return [(c.threshold, c.reason) for c in crossings([lim], {lim.id: per}, set(claimed), (80, 100))]

    assert reached(limit(100), period(79)) == []
    assert reached(limit(100), period(80)) == [(80, "spent")]
    assert reached(limit(100), period(80), frozenset({(1, 80)})) == []
    assert reached(limit(100), period(100)) == [(80, "spent"), (100, "spent")]
    assert reached(limit(100), period(81, exhausted=True)) == [(80, "spent"), (100, "refused")]
    assert reached(limit(100, (50, 150)), period(90, exhausted=True)) == [(50, "spent")]  # 150 % needs spend
    assert reached(limit(None), period(10**9)) == [] and reached(limit(0), period(0, True)) == []
    assert [g.ratio for g in gauges([limit(200), limit(None, id_=2)], {1: period(50), 2: period(7)})] == [0.25]


def test_the_gauges_show_on_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from ezat_compat.alerts import SpendGauge

    metrics = Metrics(CollectorRegistry())
    metrics.publish_spend_limits([SpendGauge("org", "acme", "monthly", 200 * USD, 50 * USD)])
    text = metrics.render()[0].decode()
    assert 'ezat_spend_limit_ratio{period="monthly",scope="org",scope_id="acme"} 0.25' in text
    assert 'ezat_spend_limit_usd{kind="cap",period="monthly",scope="org",scope_id="acme"} 200.0' in text
    assert 'ezat_spend_limit_usd{kind="spent",period="monthly",scope="org",scope_id="acme"} 50.0' in text
    metrics.publish_spend_limits([])
    assert 'scope_id="acme"' not in metrics.render()[0].decode()  # a deleted limit's series goes
