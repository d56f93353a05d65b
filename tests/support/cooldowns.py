"""The cooldown behaviour every backend keeps, one suite for all: tests/unit/test_cooldowns.py runs
it on ``LocalCooldowns``, tests/integration/test_cooldowns.py on ``RedisCooldowns``. Each binds
the ``test_*`` functions below into its module and defines the ``make`` fixture they use: a
``Factory`` of one node's cooldowns, its ``Policy`` made of ``POLICY`` and the call's changes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from ezat_compat.cooldowns import Cooldowns

T0 = 1_000.0
POLICY = {"failures": 3, "cooldown_s": 30.0, "max_cooldown_s": 300.0}

Factory = Callable[..., Cooldowns]


def cool_down(cd: Cooldowns, name: str = "a", now: float = T0) -> float:
    for _ in range(2):
        assert cd.failure(name, now) is None
    until = cd.failure(name, now)
    assert until is not None
    return until


def test_a_healthy_deployment_is_acquired(make):
    cd = make()
    assert all(cd.acquire("a", T0 + i) for i in range(5))
    cd.success("a")
    assert cd.cooling(T0) == []


def test_n_consecutive_failures_start_a_cooldown(make):
    cd = make()
    assert cd.acquire("a", T0)
    assert cd.failure("a", T0) is None
    assert cd.failure("a", T0 + 1) is None
    assert cd.acquire("a", T0 + 1)  # two failures: still healthy
    assert cd.failure("a", T0 + 2) == T0 + 32
    assert not cd.acquire("a", T0 + 2)
    assert cd.cooling(T0 + 2) == ["a"]


def test_no_traffic_during_the_cooldown(make):
    cd = make()
    until = cool_down(cd)
    assert until == T0 + 30
    assert not any(cd.acquire("a", T0 + t / 10) for t in range(300))


def test_exactly_one_probe_after_the_cooldown(make):
    cd = make()
    cool_down(cd)
    assert cd.acquire("a", T0 + 30)  # the probe
    assert not cd.acquire("a", T0 + 30)
    assert not any(cd.acquire("a", T0 + 31 + t) for t in range(20))
    assert cd.cooling(T0 + 31) == ["a"]  # refused while the probe is out


def test_exactly_one_probe_among_many_concurrent_acquirers(make):
    cd = make()
    cool_down(cd)
    threads = 32
    barrier = threading.Barrier(threads)
    results: list[bool] = []

    def worker() -> None:
        barrier.wait()
        results.append(cd.acquire("a", T0 + 30.5))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=10)
    assert len(results) == threads
    assert results.count(True) == 1


def test_probe_success_makes_the_deployment_healthy(make):
    cd = make()
    cool_down(cd)
    assert cd.acquire("a", T0 + 30)
    cd.success("a")
    assert all(cd.acquire("a", T0 + 31 + t) for t in range(5))
    assert cd.cooling(T0 + 31) == []
    # The count starts over: two failures don't cool it down again.
    assert cd.failure("a", T0 + 40) is None
    assert cd.failure("a", T0 + 41) is None
    assert cd.acquire("a", T0 + 42)


def test_probe_failure_cools_down_again_growing_to_the_cap(make):
    cd = make()
    now = cool_down(cd)
    for expected in (60, 120, 240, 300, 300):
        assert cd.acquire("a", now)
        until = cd.failure("a", now)
        assert until == now + expected
        assert not cd.acquire("a", now + expected - 0.5)
        now = until


def test_probe_success_resets_the_backoff(make):
    cd = make()
    now = cool_down(cd)
    assert cd.acquire("a", now)
    assert cd.failure("a", now) == now + 60
    now += 60
    assert cd.acquire("a", now)
    cd.success("a")
    assert cool_down(cd, now=now + 1) == now + 31


def test_retry_after_starts_a_cooldown_at_once(make):
    cd = make()
    assert cd.failure("a", T0, retry_after=7) == T0 + 7
    assert not cd.acquire("a", T0 + 6.9)
    assert cd.acquire("a", T0 + 7)  # the probe


def test_retry_after_is_capped(make):
    cd = make()
    assert cd.failure("a", T0, retry_after=86_400) == T0 + 300


@pytest.mark.parametrize("retry_after", [0.0, -5.0, float("nan")], ids=["zero", "negative", "nan"])
def test_retry_after_without_a_positive_delay_is_a_plain_failure(make, retry_after):
    cd = make()
    assert cd.failure("a", T0, retry_after=retry_after) is None
    assert cd.acquire("a", T0)


def test_a_probe_that_never_reports_back_is_released(make):
    cd = make()
    cool_down(cd)
    assert cd.acquire("a", T0 + 30)  # this probe's worker crashes
    assert not cd.acquire("a", T0 + 59.9)
    assert cd.acquire("a", T0 + 60)  # probe_timeout_s (= cooldown_s) later: a new probe
    assert not cd.acquire("a", T0 + 60)
    cd.success("a")
    assert cd.acquire("a", T0 + 61)


def test_success_resets_the_failure_count(make):
    cd = make()
    for t in range(10):  # never three in a row
        assert cd.failure("a", T0 + t) is None
        if t % 2:
            cd.success("a")
    assert cd.acquire("a", T0 + 10)


def test_a_late_success_does_not_end_a_cooldown(make):
    cd = make()
    cool_down(cd)
    cd.success("a")  # a request that started before the cooldown
    assert not cd.acquire("a", T0 + 1)
    assert cd.acquire("a", T0 + 30)


def test_a_late_failure_extends_a_cooldown_only_with_a_longer_retry_after(make):
    cd = make()
    cool_down(cd)
    assert cd.failure("a", T0 + 1) is None
    assert cd.failure("a", T0 + 1, retry_after=10) is None
    assert cd.failure("a", T0 + 1, retry_after=60) == T0 + 61
    assert not cd.acquire("a", T0 + 60)
    assert cd.acquire("a", T0 + 61)


def test_deployments_are_independent(make):
    cd = make()
    cool_down(cd, "a")
    assert cd.acquire("b", T0)
    assert cd.failure("b", T0) is None
    assert cd.cooling(T0) == ["a"]
    cool_down(cd, "c")
    assert cd.cooling(T0 + 1) == ["a", "c"]


def test_failures_far_apart_are_forgotten(make):
    cd = make()  # the default forget_s is 600 s
    assert cd.failure("a", T0) is None
    assert cd.failure("a", T0 + 1) is None
    assert cd.failure("a", T0 + 700) is None  # the first two are forgotten
    assert cd.acquire("a", T0 + 700)


def test_cooling_ends_with_the_cooldown(make):
    cd = make()
    cool_down(cd)
    assert cd.cooling(T0 + 29) == ["a"]
    assert cd.cooling(T0 + 30) == []  # over: the next acquire may probe
    assert cd.acquire("a", T0 + 30)
    assert cd.cooling(T0 + 30) == ["a"]
    cd.failure("a", T0 + 31)
    assert cd.cooling(T0 + 31) == ["a"]
