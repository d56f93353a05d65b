"""Cooldowns on Redis (the ``redis_url`` fixture, keys under a unique prefix deleted afterwards):
the shared suite (tests/support/cooldowns.py) as tests/unit/test_cooldowns.py runs it, and what
several nodes sharing one Redis see."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ezat_compat.cooldowns import Cooldowns, Policy, RedisCooldowns
from tests.support import cooldowns as shared
from tests.support.cooldowns import POLICY, T0, Factory, cool_down

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
    client.connection_pool.disconnect()


@pytest.fixture
def redis_prefix(redis_client: redis.Redis) -> Iterator[str]:
    prefix = f"test:cd:{uuid.uuid4().hex}:"
    yield prefix
    keys = list(redis_client.scan_iter(match=prefix + "*"))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def make_redis(redis_client: redis.Redis, redis_prefix: str) -> Factory:
    """Each call is another gateway node sharing the same Redis and prefix."""

    def factory(*, healthy_cache_s: float = 1.0, **policy: Any) -> Cooldowns:
        return RedisCooldowns(
            redis_client, Policy.make(**{**POLICY, **policy}), prefix=redis_prefix, healthy_cache_s=healthy_cache_s
        )

    return factory


@pytest.fixture
def make(make_redis: Factory) -> Factory:
    """The shared suite's node factory, on Redis."""
    return make_redis


# ---------------------------------------------------------------- the shared suite, again with ``make`` on Redis

test_a_healthy_deployment_is_acquired = shared.test_a_healthy_deployment_is_acquired
test_n_consecutive_failures_start_a_cooldown = shared.test_n_consecutive_failures_start_a_cooldown
test_no_traffic_during_the_cooldown = shared.test_no_traffic_during_the_cooldown
test_exactly_one_probe_after_the_cooldown = shared.test_exactly_one_probe_after_the_cooldown
test_exactly_one_probe_among_many_concurrent_acquirers = shared.test_exactly_one_probe_among_many_concurrent_acquirers
test_probe_success_makes_the_deployment_healthy = shared.test_probe_success_makes_the_deployment_healthy
test_probe_failure_cools_down_again_growing_to_the_cap = shared.test_probe_failure_cools_down_again_growing_to_the_cap
test_probe_success_resets_the_backoff = shared.test_probe_success_resets_the_backoff
test_retry_after_starts_a_cooldown_at_once = shared.test_retry_after_starts_a_cooldown_at_once
test_retry_after_is_capped = shared.test_retry_after_is_capped
test_retry_after_without_a_positive_delay_is_a_plain_failure = (
    shared.test_retry_after_without_a_positive_delay_is_a_plain_failure
)
test_a_probe_that_never_reports_back_is_released = shared.test_a_probe_that_never_reports_back_is_released
test_success_resets_the_failure_count = shared.test_success_resets_the_failure_count
test_a_late_success_does_not_end_a_cooldown = shared.test_a_late_success_does_not_end_a_cooldown
test_a_late_failure_extends_a_cooldown_only_with_a_longer_retry_after = (
    shared.test_a_late_failure_extends_a_cooldown_only_with_a_longer_retry_after
)
test_deployments_are_independent = shared.test_deployments_are_independent
test_failures_far_apart_are_forgotten = shared.test_failures_far_apart_are_forgotten
test_cooling_ends_with_the_cooldown = shared.test_cooling_ends_with_the_cooldown


# ---------------------------------------------------------------- Redis: shared by nodes


def test_a_cooldown_set_by_one_node_is_seen_by_another(make_redis):
    node_a, node_b = make_redis(), make_redis()
    assert node_b.acquire("a", T0)  # node B trusts "healthy" for up to a second
    cool_down(node_a, now=T0 + 0.1)
    assert node_b.cooling(T0 + 0.2) == ["a"]
    assert node_b.acquire("a", T0 + 0.5)  # the documented staleness: < healthy_cache_s
    assert not node_b.acquire("a", T0 + 1.0)
    assert not node_b.acquire("a", T0 + 20)


def test_without_the_healthy_cache_another_node_stops_at_once(make_redis):
    node_a, node_b = make_redis(healthy_cache_s=0), make_redis(healthy_cache_s=0)
    assert node_b.acquire("a", T0)
    cool_down(node_a, now=T0)
    assert not node_b.acquire("a", T0)


def test_one_probe_across_nodes_and_threads(make_redis):
    nodes = [make_redis() for _ in range(4)]
    cool_down(nodes[0])
    for node in nodes:  # every node has seen the cooldown
        assert not node.acquire("a", T0 + 1)
    barrier = threading.Barrier(32)
    results: list[bool] = []

    def worker(node: Cooldowns) -> None:
        barrier.wait()
        results.append(node.acquire("a", T0 + 30))

    pool = [threading.Thread(target=worker, args=(nodes[i % 4],)) for i in range(32)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=10)
    assert results.count(True) == 1 and len(results) == 32


def test_a_probe_success_on_one_node_heals_every_node(make_redis):
    node_a, node_b = make_redis(), make_redis()
    cool_down(node_b)
    assert node_a.acquire("a", T0 + 30)
    assert not node_b.acquire("a", T0 + 30)
    node_a.success("a")
    assert node_b.acquire("a", T0 + 31)


def test_failures_count_across_nodes(make_redis):
    nodes = [make_redis() for _ in range(3)]
    assert nodes[0].failure("a", T0) is None
    assert nodes[1].failure("a", T0) is None
    assert nodes[2].failure("a", T0) == T0 + 30
    assert not nodes[0].acquire("a", T0 + 1)


def test_prefixes_isolate(make_redis, redis_client, redis_prefix):
    cool_down(make_redis())
    other = RedisCooldowns(redis_client, Policy.make(**POLICY), prefix=redis_prefix + "other:")
    assert other.acquire("a", T0 + 1)
    assert other.cooling(T0 + 1) == []


def test_redis_keys_expire(make_redis, redis_client, redis_prefix):
    cd = make_redis()
    cool_down(cd)
    assert isinstance(cd, RedisCooldowns)
    assert 0 < redis_client.pttl(cd.key("a")) <= (30 + 30 + 600 + 60) * 1000
    assert redis_client.pttl(redis_prefix + "names") > 0
    cd.failure("b", T0)
    assert 0 < redis_client.pttl(cd.key("b")) <= (600 + 60) * 1000


def test_the_hot_path_of_a_healthy_deployment_skips_redis(make_redis, monkeypatch):
    cd = make_redis()
    assert cd.acquire("a", T0)  # one round trip: clean

    def no_round_trip(*args: object, **kwargs: object) -> None:
        raise AssertionError("a clean deployment needs no round trip")

    monkeypatch.setattr(cd, "_acquire", no_round_trip)
    monkeypatch.setattr(cd, "_success", no_round_trip)
    for i in range(10):
        assert cd.acquire("a", T0 + i / 10)
        cd.success("a")
