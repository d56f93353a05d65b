"""Stored conversations within bounds on ONE gevent worker (docs/responses.md, "Stored
responses"): sixty concurrent ``input_items`` reads of a 200,000-item input, each a page read
from the store's index, leave another organisation's stream on time (its keep-alive pings within
2 × ``keepalive_s``, or a keep-alive and a third of the attack on a loaded machine), the worker
the same process and its memory within 200 MB of where it started; continues store only what each
turn adds; an organisation at its storage quota gets a 400 naming it before any work, while
another organisation is served."""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat.store.db import make_engine
from ezat_compat.store.quota import DEFAULT_QUOTA_MB, MIB, UNDER_FOR_S
from ezat_compat.store.responses import DAY_S, ResponseStore
from ezat_compat.translate.item_references import item_key
from tests.integration.harness import Gateway, ModelSpec, Sim, only_worker, rss_mb
from tests.support.watched import Watched

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEEPALIVE_S = 1.0
MODEL = "anthropic/claude-sonnet-5-5"
HUGE = 200_000


@pytest.fixture
def one_worker(tmp_path: Path) -> Iterator[tuple[Gateway, Sim]]:
    sim = Sim(name="stored").start()
    gateway = Gateway(
        root=tmp_path / "gw",
        models=[ModelSpec(deployments=[{"name": "sim", "base_url": sim.url}])],
        workers=1,
        gateway_settings={"keepalive_s": KEEPALIVE_S},
        server_settings={"timeout_s": 30},
    ).start()
    try:
        yield gateway, sim
    finally:
        gateway.stop()
        sim.stop()


def database(gateway: Gateway) -> Path:
    return gateway.root / "ezat.db"


def org_id(gateway: Gateway, name: str) -> int:
    with sqlite3.connect(database(gateway)) as conn:
        return int(conn.execute("SELECT id FROM orgs WHERE name = ?", (name,)).fetchone()[0])


def held(gateway: Gateway) -> int:
    with sqlite3.connect(database(gateway)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM reservations").fetchone()[0])


def post(gateway: Gateway, key: str, body: dict[str, Any], path: str = "/openai/v1/responses") -> requests.Response:
    return requests.post(
        gateway.url + path, json={"model": MODEL, **body}, headers={"authorization": f"Bearer {key}"}, timeout=120
    )


def get(gateway: Gateway, key: str, path: str) -> requests.Response:
    return requests.get(gateway.url + path, headers={"authorization": f"Bearer {key}"}, timeout=120)


def test_sixty_reads_of_a_200000_item_input_leave_another_stream_on_time(one_worker: tuple[Gateway, Sim]) -> None:
    gateway, _ = one_worker
    watched_key, lister = gateway.new_key("watched"), gateway.new_key("lister")
    # Stored as the gateway stores it (its POST takes a minute of translation on a loaded machine).
    engine = make_engine(f"sqlite:///{database(gateway)}")
    try:
        rid = "resp_01a24e71-034b-7f68-ad56-49b2cf93bcf0"
        items = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"item {n}"} for n in range(HUGE)]
        response = {"id": rid, "object": "response", "output": []}
        ResponseStore(engine, 30 * DAY_S).put(org_id(gateway, "lister"), response, items, 0, False, time.time())
    finally:
        engine.dispose()
    key = item_key(rid)
    pages = {
        "?limit=100": f"in_{key}{HUGE - 1}",
        f"?order=asc&limit=100&after=in_{key}100000": f"in_{key}100001",
        f"?after=in_{key}150000&limit=20": f"in_{key}149999",
        f"?order=asc&before=in_{key}050&limit=3": f"in_{key}000",
    }
    worker = only_worker(gateway)
    rss_start = rss_mb(worker)
    watched = Watched(gateway, watched_key, model=MODEL)
    time.sleep(1.0)
    started = time.monotonic()
    asks = list(itertools.islice(itertools.cycle(pages), 60))
    with ThreadPoolExecutor(max_workers=60) as pool:
        answers = list(pool.map(lambda q: get(gateway, lister, f"/openai/v1/responses/{rid}/input_items{q}"), asks))
    took = time.monotonic() - started
    for query, answer in zip(asks, answers, strict=True):
        assert answer.status_code == 200, answer.text[:300]
        assert answer.json()["first_id"] == pages[query], query
    gap = watched.largest_gap(started)
    assert gap <= max(2 * KEEPALIVE_S, KEEPALIVE_S + took / 3), f"the other stream waited {gap:.2f} s ({took:.2f} s)"
    assert not watched.done.is_set() and only_worker(gateway) == worker
    watched.response.close()
    deadline = time.monotonic() + 30
    while rss_mb(worker) > rss_start + 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rss_mb(worker) <= rss_start + 200, (rss_start, rss_mb(worker))
    deadline = time.monotonic() + 15
    while held(gateway) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held(gateway) == 0


def test_continues_store_only_what_each_turn_adds(one_worker: tuple[Gateway, Sim]) -> None:
    gateway, sim = one_worker
    key = gateway.new_key("chain", balance="1000")
    big = [{"role": "user", "content": f"{n} " + "x" * 200_000} for n in range(15)]  # 3 MB
    made = post(gateway, key, {"max_output_tokens": 16, "input": big})
    assert made.status_code == 200, made.text[:300]
    previous = made.json()["id"]
    for turn in range(5):
        sim.clear()
        resp = post(gateway, key, {"max_output_tokens": 16, "input": f"word {turn}", "previous_response_id": previous})
        assert resp.status_code == 200, resp.text[:300]
        previous = resp.json()["id"]
        (sent,) = sim.bodies()
        assert sum(len(str(m["content"])) for m in sent["messages"]) > 3_000_000  # the whole conversation went
    with sqlite3.connect(database(gateway)) as conn:
        kept = conn.execute(
            "SELECT COUNT(*), SUM(stored_bytes), SUM(length(context)) FROM responses WHERE org_id = ?",
            (org_id(gateway, "chain"),),
        ).fetchone()
        usage = conn.execute(
            "SELECT stored_count, stored_bytes FROM storage_usage WHERE org_id = ?", (org_id(gateway, "chain"),)
        ).fetchone()
    assert kept[0] == 6 and kept[2] < 3_100_000  # 3 MB once, not six times
    assert usage == (6, kept[1])
    listed = get(gateway, key, f"/openai/v1/responses/{previous}/input_items").json()["data"]
    assert [item["content"][0]["text"] for item in listed] == ["word 4"]


def test_an_organisation_at_its_storage_quota_gets_a_400_naming_it(one_worker: tuple[Gateway, Sim]) -> None:
    gateway, _ = one_worker
    full, other = gateway.new_key("full"), gateway.new_key("roomy")
    kept = post(gateway, full, {"max_output_tokens": 16, "input": "keep me"})
    assert kept.status_code == 200
    full_id = org_id(gateway, "full")
    with sqlite3.connect(database(gateway)) as conn:
        (size,) = conn.execute("SELECT stored_bytes FROM storage_usage WHERE org_id = ?", (full_id,)).fetchone()
        conn.execute(
            "UPDATE storage_usage SET stored_bytes = ? WHERE org_id = ?", (int(DEFAULT_QUOTA_MB * MIB), full_id)
        )
    before = gateway.usage("--org", "full")
    time.sleep(UNDER_FOR_S + 0.1)  # the worker found "full" under its quota just now: it reads again after this

    for body in ({"input": "more"}, {"input": "more", "stream": True}):
        refused = post(gateway, full, body)
        assert refused.status_code == 400 and refused.headers["content-type"].startswith("application/json")
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("storage_quota_exceeded", "store")
        assert "[responses] org_quota_mb" in error["message"] and "1024 MB" in error["message"]
    thread = post(
        gateway,
        full,
        {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "thread": {"type": "create"}},
        path="/v1/messages",
    )
    assert thread.status_code == 400
    assert thread.json()["error"]["details"] == {"error_code": "thread_unsupported_request"}
    assert "[responses] org_quota_mb" in thread.json()["error"]["message"]
    assert gateway.usage("--org", "full") == before and held(gateway) == 0  # refused before admission

    unstored = post(gateway, full, {"input": "go on", "store": False, "previous_response_id": kept.json()["id"]})
    assert unstored.status_code == 200  # served, nothing stored
    assert post(gateway, other, {"input": "room here"}).status_code == 200  # another organisation
    assert get(gateway, full, f"/openai/v1/responses/{kept.json()['id']}").status_code == 200

    gone = requests.delete(
        gateway.url + f"/openai/v1/responses/{kept.json()['id']}",
        headers={"authorization": f"Bearer {full}"},
        timeout=30,
    )
    assert gone.status_code == 200
    with sqlite3.connect(database(gateway)) as conn:
        (left,) = conn.execute("SELECT stored_bytes FROM storage_usage WHERE org_id = ?", (full_id,)).fetchone()
    assert left == int(DEFAULT_QUOTA_MB * MIB) - size  # a delete frees what it held
    assert post(gateway, full, {"input": "now there is room"}).status_code == 200
