"""The thinking stash (store/thinking.py) on SQLite, PostgreSQL and Redis: blocks come back
exactly as kept, per organisation, until ``[gateway] thinking_ttl_s`` has passed; several
processes share the SQLite stash; a broken backend finds nothing instead of failing.
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, create_engine, func, select, text

from ezat_compat.config import load_config
from ezat_compat.store.db import make_engine, migrate
from ezat_compat.store.tables import thinking_stash
from ezat_compat.store.thinking import (
    MAX_BLOCKS_CHARS,
    READ_CHUNK,
    DbThinkingStash,
    RedisThinkingStash,
    ThinkingStash,
    make_thinking_stash,
)
from tests.conftest import free_port
from tests.support.migrated import migrate_like_the_template, migrated_sqlite, with_schema

NOW = 1_750_000_000.0
TTL = 60.0
SPAWN = multiprocessing.get_context("spawn")
BACKENDS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
]

# What a signature and a redacted block look like (base64 with + / =), and thinking text with
# characters JSON escapes or that need more than one UTF-8 byte.
SIG = "EuYBCkQYAiJAjAcQ3n+6Rk9VnW/2QhLcHqRiDb0xV7t3ZC4yWn8pD1fUaL+o9s2gXJrE5MmkQe0zT6NvB0i8cYw3hFx2RgA0Egy=="
BLOCKS: list[dict[str, Any]] = [
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP=="},
    {"type": "thinking", "thinking": 'Tōkyō (日本) "quoted"\n\ttab \\ back 🌦 \u2028', "signature": SIG},
]
OTHER: list[dict[str, Any]] = [{"type": "thinking", "thinking": "Something else.", "signature": SIG[::-1]}]


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(migrated_sqlite(tmp_path / "ezat.db"))
    yield eng
    eng.dispose()


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[Engine]:
    schema = f"ezat_think_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        eng = make_engine(with_schema(postgres_url, schema))
        migrate_like_the_template(eng, postgres_url)
        yield eng
        eng.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(redis_url)
    prefix = f"ezat-test:th:{uuid.uuid4().hex[:8]}:"
    yield client, prefix
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest) -> Any:
    """A factory of stashes with a given TTL on one backend nobody else uses."""
    if request.param == "redis":
        client, prefix = request.getfixturevalue("redis_client")
        return lambda ttl_s=TTL: RedisThinkingStash(client, ttl_s, prefix=prefix)
    engine = request.getfixturevalue("sqlite_engine" if request.param == "sqlite" else "pg_engine")
    return lambda ttl_s=TTL: DbThinkingStash(engine, ttl_s)


@pytest.fixture
def stash(make: Any) -> ThinkingStash:
    return make()


def test_blocks_come_back_exactly_as_kept(stash: ThinkingStash) -> None:
    stash.put(1, ["toolu_a", "toolu_b"], BLOCKS, NOW)
    found = stash.get(1, ["toolu_a", "toolu_b"], NOW + 1)
    assert found == {"toolu_a": BLOCKS, "toolu_b": BLOCKS}
    want = json.dumps(BLOCKS, ensure_ascii=False).encode()
    assert json.dumps(found["toolu_a"], ensure_ascii=False).encode() == want
    assert found["toolu_a"][1]["signature"] == SIG


def test_only_the_ids_asked_for_and_kept(stash: ThinkingStash) -> None:
    stash.put(1, ["call_1"], BLOCKS, NOW)
    stash.put(1, ["call_2"], OTHER, NOW)
    assert stash.get(1, ["call_2", "call_unknown"], NOW) == {"call_2": OTHER}
    assert stash.get(1, [], NOW) == {}


def test_any_client_id_is_a_key(stash: ThinkingStash) -> None:
    odd = ["call:weather/1", "x" * 5000, "日本 🌦", ""]
    stash.put(1, odd, BLOCKS, NOW)
    assert stash.get(1, odd, NOW) == dict.fromkeys(odd, BLOCKS)


def test_scoped_to_the_organisation(stash: ThinkingStash) -> None:
    stash.put(1, ["call_1"], BLOCKS, NOW)
    stash.put(2, ["call_1"], OTHER, NOW)
    assert stash.get(1, ["call_1"], NOW) == {"call_1": BLOCKS}
    assert stash.get(2, ["call_1"], NOW) == {"call_1": OTHER}
    assert stash.get(3, ["call_1"], NOW) == {}


@pytest.mark.parametrize(
    "later, found",
    [(TTL - 0.001, True), (TTL, False), (TTL + 3600, False)],
    ids=["just-before", "at-ttl", "long-after"],
)
def test_ttl(stash: ThinkingStash, later: float, found: bool) -> None:
    stash.put(1, ["call_1"], BLOCKS, NOW)
    assert stash.get(1, ["call_1"], NOW + later) == ({"call_1": BLOCKS} if found else {})


def test_a_later_put_replaces_and_renews(stash: ThinkingStash) -> None:
    stash.put(1, ["call_1"], BLOCKS, NOW)
    stash.put(1, ["call_1"], OTHER, NOW + 30)
    assert stash.get(1, ["call_1"], NOW + TTL + 10) == {"call_1": OTHER}


def test_many_ids_in_one_get(stash: ThinkingStash) -> None:
    ids = [f"call_{i}" for i in range(READ_CHUNK * 2 + 7)]
    stash.put(1, ids[::2], BLOCKS, NOW)
    assert stash.get(1, ids, NOW) == dict.fromkeys(ids[::2], BLOCKS)


@pytest.mark.parametrize(
    "ttl_s, blocks",
    [
        (0.0, BLOCKS),
        (TTL, []),
        (TTL, [{"type": "thinking", "thinking": "x" * MAX_BLOCKS_CHARS, "signature": SIG}]),
    ],
    ids=["no-ttl", "no-blocks", "over-the-size-bound"],
)
def test_nothing_kept(make: Any, ttl_s: float, blocks: list[dict[str, Any]]) -> None:
    stash = make(ttl_s)
    stash.put(1, ["call_1"], blocks, NOW)
    assert stash.get(1, ["call_1"], NOW) == {}


# ---------------------------------------------------------------- database specifics


def _rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(thinking_stash)).scalar_one())


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_expired_rows_are_purged_in_bounded_batches(request: pytest.FixtureRequest, backend: str) -> None:
    engine = request.getfixturevalue("sqlite_engine" if backend == "sqlite" else "pg_engine")
    stash = DbThinkingStash(engine, TTL, purge_every_s=1e9, purge_batch=2)
    stash.put(1, [f"old_{i}" for i in range(5)], BLOCKS, NOW)  # the first put purges (nothing yet)
    stash.put(1, ["fresh"], BLOCKS, NOW + TTL)
    assert _rows(engine) == 6
    assert [stash.purge(NOW + TTL), stash.purge(NOW + TTL), stash.purge(NOW + TTL), stash.purge(NOW + TTL)] == [
        2,
        2,
        1,
        0,
    ]
    assert stash.get(1, ["fresh"], NOW + TTL) == {"fresh": BLOCKS}


def test_put_purges_now_and_then(sqlite_engine: Engine) -> None:
    stash = DbThinkingStash(sqlite_engine, TTL, purge_every_s=100, purge_batch=1000)
    stash.put(1, ["a", "b"], BLOCKS, NOW)
    stash.put(1, ["c"], BLOCKS, NOW + TTL + 1)  # before purge_every_s: no purge yet
    assert _rows(sqlite_engine) == 3
    stash.put(1, ["d"], BLOCKS, NOW + 100)  # a purge is due: a and b are gone
    assert _rows(sqlite_engine) == 2


def _child_put(url: str, org_id: int, ids: list[str], queue: Any) -> None:
    try:
        engine = make_engine(url)
        stash = DbThinkingStash(engine, TTL)
        for tool_id in ids:
            stash.put(org_id, [tool_id], [{**BLOCKS[1], "thinking": tool_id}], NOW)
        queue.put(stash.get(org_id, ids, NOW))
        engine.dispose()
    except Exception as exc:  # reported to the parent
        queue.put(f"error: {exc!r}")


def test_two_processes_share_the_sqlite_stash(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    migrate(url)
    queue = SPAWN.Queue()
    ids = {1: [f"p1_{i}" for i in range(30)], 2: [f"p2_{i}" for i in range(30)]}
    procs = [SPAWN.Process(target=_child_put, args=(url, org, ids[org], queue)) for org in (1, 2)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert all(isinstance(r, dict) and len(r) == 30 for r in results), results
    engine = make_engine(url)
    try:
        here = DbThinkingStash(engine, TTL)  # this process reads what both others kept
        for org in (1, 2):
            found = here.get(org, ids[org], NOW)
            assert {k: v[0]["thinking"] for k, v in found.items()} == {i: i for i in ids[org]}
        assert here.get(1, ids[2], NOW) == {}
    finally:
        engine.dispose()


def test_a_database_without_the_table_finds_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'bare.db'}")  # not migrated
    try:
        stash = DbThinkingStash(engine, TTL)
        stash.put(1, ["call_1"], BLOCKS, NOW)
        assert stash.get(1, ["call_1"], NOW) == {}
        assert "thinking stash: put failed" in caplog.text
    finally:
        engine.dispose()


# ---------------------------------------------------------------- Redis specifics


@pytest.mark.redis
def test_redis_keys_expire_with_the_ttl(redis_client: tuple[redis.Redis, str]) -> None:
    client, prefix = redis_client
    stash = RedisThinkingStash(client, TTL, prefix=prefix)
    stash.put(7, ["call_1"], BLOCKS, NOW)
    ttl_ms = client.pttl(stash.key(7, "call_1"))
    assert 0 < ttl_ms <= TTL * 1000


@pytest.mark.redis
def test_redis_values_not_ours_are_absent(redis_client: tuple[redis.Redis, str]) -> None:
    client, prefix = redis_client
    stash = RedisThinkingStash(client, TTL, prefix=prefix)
    client.set(stash.key(1, "call_1"), "garbage", px=60_000)
    client.set(stash.key(1, "call_2"), f"{NOW + TTL!r}\nnot json", px=60_000)
    assert stash.get(1, ["call_1", "call_2"], NOW) == {}


def test_unreachable_redis_finds_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        stash = make_thinking_stash(engine, f"redis://127.0.0.1:{free_port()}/0", TTL)
        assert isinstance(stash, RedisThinkingStash)
        stash.put(1, ["call_1"], BLOCKS, NOW)
        assert stash.get(1, ["call_1"], NOW) == {}
        assert "thinking stash: put failed" in caplog.text
    finally:
        engine.dispose()


# ---------------------------------------------------------------- factory and configuration


def test_factory_without_redis_is_the_database(sqlite_engine: Engine) -> None:
    stash = make_thinking_stash(sqlite_engine, "", 5.0)
    assert isinstance(stash, DbThinkingStash)
    stash.put(1, ["call_1"], BLOCKS, NOW)
    assert stash.get(1, ["call_1"], NOW + 4.9) == {"call_1": BLOCKS}
    assert stash.get(1, ["call_1"], NOW + 5) == {}


@pytest.mark.redis
def test_factory_with_redis(sqlite_engine: Engine, redis_url: str) -> None:
    prefix = f"ezat-test:th:{uuid.uuid4().hex[:8]}:"
    stash = make_thinking_stash(sqlite_engine, redis_url, TTL, prefix=prefix)
    assert isinstance(stash, RedisThinkingStash)
    stash.put(1, ["call_1"], BLOCKS, NOW)
    assert stash.get(1, ["call_1"], NOW) == {"call_1": BLOCKS}
    assert _rows(sqlite_engine) == 0
    client = redis.Redis.from_url(redis_url)
    client.delete(stash.key(1, "call_1"))
    client.close()


CONFIG = """
[gateway]
{extra}
[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5"]
price = {{ input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }}

[[models.deployments]]
name = "primary"
base_url = "https://api.anthropic.com"
upstream_model = "claude-sonnet-5-5"
"""


@pytest.mark.parametrize("extra, ttl", [("", 86400.0), ("thinking_ttl_s = 600", 600.0)], ids=["default", "set"])
def test_thinking_ttl_setting(tmp_path: Path, extra: str, ttl: float) -> None:
    path = tmp_path / "ezat.toml"
    path.write_text(CONFIG.format(extra=extra))
    assert load_config(path, environ={}).gateway.thinking_ttl_s == ttl
