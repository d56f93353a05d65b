"""The router's plan: tiers by priority, weighted shares, rendezvous session affinity."""

from __future__ import annotations

import ast
import random
from collections import Counter
from pathlib import Path

import pytest

from ezat_compat import routing
from ezat_compat.domain import Deployment
from ezat_compat.routing import plan, rendezvous_order


def dep(name: str, *, priority: int = 0, weight: float = 1.0) -> Deployment:
    return Deployment(name=name, base_url=f"http://{name}.test", upstream_model="m", priority=priority, weight=weight)


def no_rand() -> float:
    raise AssertionError("this plan must not use randomness")


def names(ds: list[Deployment]) -> list[str]:
    return [d.name for d in ds]


def first_counts(deployments: list[Deployment], n: int, seed: int = 7) -> Counter[str]:
    rand = random.Random(seed).random
    return Counter(plan(deployments, session=None, rand=rand)[0].name for _ in range(n))


# ---------------------------------------------------------------- no session


def test_single_deployment_short_circuits_without_randomness():
    only = dep("only")
    assert plan([only], session=None, rand=no_rand) == [only]
    assert plan([only], session="s", rand=no_rand) == [only]
    assert plan([], session=None, rand=no_rand) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_weights_1_to_3_split_1000_requests_within_a_few_percent(seed):
    counts = first_counts([dep("a", weight=1), dep("b", weight=3)], 1000, seed)
    assert abs(counts["a"] / 1000 - 0.25) < 0.04
    assert abs(counts["b"] / 1000 - 0.75) < 0.04


def test_three_way_weights_share_the_first_pick():
    counts = first_counts([dep("a", weight=1), dep("b", weight=2), dep("c", weight=5)], 8000)
    for name, share in {"a": 1 / 8, "b": 2 / 8, "c": 5 / 8}.items():
        assert abs(counts[name] / 8000 - share) < 0.02, counts


def test_second_pick_is_weighted_among_the_rest():
    # After "c" (weight 2) goes first, "a" (1) and "b" (3) share the second place 1:3.
    ds = [dep("a", weight=1), dep("b", weight=3), dep("c", weight=2)]
    rand = random.Random(11).random
    seconds = Counter(p[1].name for p in (plan(ds, session=None, rand=rand) for _ in range(6000)) if p[0].name == "c")
    total = sum(seconds.values())
    assert abs(seconds["a"] / total - 0.25) < 0.04, seconds


def test_weighted_order_is_input_order_free_in_distribution():
    ds = [dep("a", weight=1), dep("b", weight=3)]
    counts = first_counts(ds[::-1], 1000)
    assert abs(counts["a"] / 1000 - 0.25) < 0.04


def test_rand_at_the_edges_of_its_range():
    ds = [dep("a", weight=1), dep("b", weight=3)]
    assert names(plan(ds, session=None, rand=lambda: 0.0)) == ["a", "b"]
    assert names(plan(ds, session=None, rand=lambda: 0.9999999999)) == ["b", "a"]
    assert names(plan(ds, session=None, rand=lambda: 1.0)) == ["b", "a"]  # a bad RNG still plans


# ---------------------------------------------------------------- tiers and failover order

TIERED = [
    dep("t1-a", priority=1),
    dep("t0-a", priority=0, weight=2),
    dep("t2", priority=2),
    dep("t1-b", priority=1, weight=3),
    dep("t0-b", priority=0),
]


@pytest.mark.parametrize("session", [None, "conversation-42"], ids=["no-session", "session"])
def test_lower_priority_tiers_always_come_first(session):
    rand = random.Random(5).random
    for i in range(300):
        order = plan(TIERED, session=session if session is None else f"{session}-{i}", rand=rand)
        assert [d.priority for d in order] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("session", [None, "s"], ids=["no-session", "session"])
def test_failover_order_covers_every_deployment_once(session):
    rand = random.Random(9).random
    for _ in range(100):
        order = plan(TIERED, session=session, rand=rand)
        assert sorted(names(order)) == sorted(names(TIERED))


def test_tiers_keep_the_first_pick_weighted_inside_tier_zero():
    counts = first_counts(TIERED, 3000)
    assert set(counts) == {"t0-a", "t0-b"}
    assert abs(counts["t0-a"] / 3000 - 2 / 3) < 0.04


# ---------------------------------------------------------------- session affinity

SPREAD = [dep("a", weight=1), dep("b", weight=2), dep("c", weight=1)]


def test_one_session_plans_the_same_deployment_on_every_worker_and_input_order():
    firsts = set()
    orders = set()
    for worker in range(5):
        rand = random.Random(worker).random
        shuffler = random.Random(100 + worker)
        for _ in range(10):  # 5 workers x 10 = 50 requests
            ds = list(SPREAD)
            shuffler.shuffle(ds)
            order = plan(ds, session="conversation-42", rand=rand)
            firsts.add(order[0].name)
            orders.add(tuple(names(order)))
    assert len(firsts) == 1
    assert len(orders) == 1  # the whole failover order is shared, not just the first choice


def test_session_path_uses_no_randomness():
    assert len(plan(SPREAD, session="x", rand=no_rand)) == 3


def test_sessions_spread_over_deployments_by_weight():
    counts = Counter(plan(SPREAD, session=f"session-{i}", rand=no_rand)[0].name for i in range(4000))
    for name, share in {"a": 0.25, "b": 0.5, "c": 0.25}.items():
        assert abs(counts[name] / 4000 - share) < 0.03, counts


def test_an_unavailable_first_choice_falls_over_in_hash_order_without_reshuffling_others():
    moved = 0
    for i in range(1000):
        session = f"s{i}"
        full = plan(SPREAD, session=session, rand=no_rand)
        without_b = [d for d in SPREAD if d.name != "b"]
        reduced = plan(without_b, session=session, rand=no_rand)
        # The rendezvous property: the order without "b" is the full order with "b" skipped.
        assert names(reduced) == [n for n in names(full) if n != "b"]
        if full[0].name == "b":
            moved += 1
            assert reduced[0] == full[1]
        else:
            assert reduced[0] == full[0]  # sessions on "a" and "c" keep their deployment
    assert 400 < moved < 600  # "b" holds half the sessions


def test_adding_a_deployment_moves_sessions_only_onto_it():
    grown = [*SPREAD, dep("d", weight=1)]
    for i in range(500):
        before = plan(SPREAD, session=f"s{i}", rand=no_rand)[0].name
        after = plan(grown, session=f"s{i}", rand=no_rand)[0].name
        assert after in {before, "d"}


def test_empty_session_is_no_session():
    rand = random.Random(3).random
    counts = Counter(plan(SPREAD, session="", rand=rand)[0].name for _ in range(400))
    assert len(counts) == 3


def test_rendezvous_hash_is_pinned():
    # Every gateway node must agree: this order may only change together with a release note,
    # since changing the hash moves every conversation off its prompt cache once.
    ds = [dep(n) for n in ("alpha", "beta", "gamma", "delta")]
    assert names(rendezvous_order(ds, "conversation-42")) == PINNED_ORDER


PINNED_ORDER = ["gamma", "alpha", "delta", "beta"]


def test_odd_session_strings_hash():
    for session in ["\ud800lone-surrogate", "x" * 256, "émoji 🙂", "\x00"]:
        assert len(plan(SPREAD, session=session, rand=no_rand)) == 3


# ---------------------------------------------------------------- purity


def test_routing_is_pure():
    tree = ast.parse(Path(routing.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    forbidden = {
        "random",
        "time",
        "datetime",
        "uuid",
        "os",
        "socket",
        "requests",
        "flask",
        "redis",
        "sqlalchemy",
        "gevent",
        "threading",
    }
    assert not imported & forbidden
