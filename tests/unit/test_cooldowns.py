"""Cooldowns with an injected clock: the shared suite (tests/support/cooldowns.py) on LocalCooldowns
(on RedisCooldowns in tests/integration/test_cooldowns.py), an unreachable Redis, construction."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ezat_compat.cooldowns import Cooldowns, LocalCooldowns, Policy, RedisCooldowns, make_cooldowns
from tests.conftest import free_port
from tests.support import cooldowns as shared
from tests.support.cooldowns import POLICY, T0, Factory


@pytest.fixture
def make() -> Factory:
    """Builds the local cooldowns of one node (tests/integration/test_cooldowns.py runs the
    shared suite on Redis)."""

    def factory(**policy: Any) -> Cooldowns:
        return LocalCooldowns(Policy.make(**{**POLICY, **policy}))

    return factory


# ---------------------------------------------------------------- the shared suite (tests/support/cooldowns.py)

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


# ---------------------------------------------------------------- Redis


def test_unreachable_redis_fails_open(caplog):
    cd = make_cooldowns(f"redis://127.0.0.1:{free_port()}/15", **POLICY, prefix="test:cd:down:")
    with caplog.at_level(logging.WARNING, logger="ezat_compat.cooldowns"):
        assert cd.acquire("a", T0)
        assert cd.acquire("a", T0 + 0.5)  # cached: no second timeout
        assert cd.failure("a", T0) is None
        cd.success("a")
        assert cd.cooling(T0) == []
    assert "Redis unreachable" in caplog.text
    assert caplog.text.count("treating a as healthy") == 1


# ---------------------------------------------------------------- construction


def test_make_cooldowns_picks_the_backend():
    local = make_cooldowns("", failures=3, cooldown_s=30, max_cooldown_s=300)
    assert isinstance(local, LocalCooldowns)
    shared = make_cooldowns(
        "redis://127.0.0.1:1/15", failures=3, cooldown_s=30, max_cooldown_s=300, prefix="x:"
    )  # connects lazily: nothing happens here
    assert isinstance(shared, RedisCooldowns)
    assert shared.key("dep") == "x:d:dep"


def test_probe_timeout_defaults_to_the_cooldown_with_a_floor():
    assert Policy.make(failures=3, cooldown_s=30, max_cooldown_s=300).probe_timeout_s == 30
    assert Policy.make(failures=3, cooldown_s=0, max_cooldown_s=300).probe_timeout_s == 1
    assert Policy.make(failures=3, cooldown_s=30, max_cooldown_s=300, probe_timeout_s=5).probe_timeout_s == 5
