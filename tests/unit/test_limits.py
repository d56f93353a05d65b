"""Per-key rate limits in one process on the embedded SQLite counters: rpm, tpm, unlimited keys,
window resets.

tests/integration/test_limits.py runs the behaviour tests (tests/support/limits.py) on Redis too,
and the tests that need a second process (exact rpm across processes, counters across a fork).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from limits.storage import storage_from_string

from ezat_compat.errors import GatewayError, RateLimitError
from ezat_compat.limits import RateLimits, SQLiteCounterStorage
from tests.support import limits as behaviour
from tests.support.limits import key


class Clock:
    """A settable clock for the embedded storage's windows."""

    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_limits(tmp_path: Path) -> Iterator[Any]:
    """Builds ``RateLimits`` on the embedded counters of this test (closed afterwards)."""
    made: list[RateLimits] = []

    def make(**kwargs: Any) -> RateLimits:
        limits = RateLimits(**{"redis_url": None, "embedded_path": str(tmp_path / "limits.db"), **kwargs})
        made.append(limits)
        return limits

    yield make
    for limits in made:
        limits.close()


# ---------------------------------------------------------------- every backend (tests/support/limits.py)

test_rpm_refusal_says_what_and_when = behaviour.test_rpm_refusal_says_what_and_when
test_tpm_reserves_at_admission_and_settles_to_the_real_count = (
    behaviour.test_tpm_reserves_at_admission_and_settles_to_the_real_count
)
test_tpm_refuses_a_request_that_can_never_fit = behaviour.test_tpm_refuses_a_request_that_can_never_fit
test_tpm_refusal_does_not_spend_a_request = behaviour.test_tpm_refusal_does_not_spend_a_request
test_rpm_refusal_gives_the_tokens_back = behaviour.test_rpm_refusal_gives_the_tokens_back
test_tpm_is_exact_under_concurrent_admissions = behaviour.test_tpm_is_exact_under_concurrent_admissions


@pytest.mark.parametrize("backend_kind", ["embedded", "redis"])
def test_unlimited_keys_never_touch_storage(tmp_path: Path, backend_kind: str) -> None:
    # Neither storage exists: an unreachable Redis port, a folder that isn't there.
    missing = tmp_path / "missing" / "limits.db"
    url = "redis://127.0.0.1:1/15" if backend_kind == "redis" else None
    limits = RateLimits(url, str(missing))
    for _ in range(100):
        assert limits.admit(key(12), 1_000_000) is None
        limits.settle_tokens(None, 1_000_000)
    assert limits.storage is None
    assert not missing.parent.exists()


def test_unreachable_redis_is_a_gateway_error() -> None:
    limits = RateLimits("redis://127.0.0.1:1/15", "/nonexistent/limits.db")
    with pytest.raises(GatewayError, match="rate-limit store is unreachable") as caught:
        limits.admit(key(13, rpm=5))
    assert caught.value.status == 500
    limits.close()


def test_embedded_window_resets_with_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    limits = RateLimits(None, str(tmp_path / "limits.db"), clock=clock)
    ctx = key(14, rpm=2, tpm=50)
    limits.admit(ctx)
    limits.admit(ctx)
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx)
    assert caught.value.retry_after == 60
    clock.now += 30.2
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx)
    assert caught.value.retry_after == 30  # ceil(29.8)
    clock.now += 29.7
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx)
    assert caught.value.retry_after == 1  # ceil(0.1), never 0
    clock.now += 0.5
    limits.admit(ctx)  # a new window
    limits.admit(ctx)
    with pytest.raises(RateLimitError):
        limits.admit(ctx)

    clock.now = 1_750_000_040.0  # 20 s into a clock-aligned minute of tokens
    limits.admit(replace(ctx, rpm=None), 50)
    with pytest.raises(RateLimitError, match="tokens per minute") as caught:
        limits.admit(replace(ctx, rpm=None), 1)
    assert caught.value.retry_after == 40
    clock.now += 40
    limits.admit(replace(ctx, rpm=None), 50)
    limits.close()


def test_embedded_storage_is_a_registered_limits_storage(tmp_path: Path) -> None:
    storage = storage_from_string(f"ezat-sqlite://{tmp_path / 'c.db'}")
    assert isinstance(storage, SQLiteCounterStorage)
    assert storage.check()
    assert storage.incr("k", 60) == 1
    assert storage.incr("k", 60, amount=4) == 5
    assert storage.get("k") == 5
    assert storage.get_expiry("k") > time.time() + 50
    storage.clear("k")
    assert storage.get("k") == 0
    storage.incr("a", 60)
    storage.incr("b", 60)
    assert storage.reset() == 2
    storage.close()
    with pytest.raises(ValueError, match="ezat-sqlite:///PATH"):
        SQLiteCounterStorage("ezat-sqlite://")


def test_tokens_and_the_request_are_counted_in_one_transaction(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(21, rpm=5, tpm=1_000)
    limits.admit(ctx, 10)  # opens the embedded storage
    storage = limits.storage
    assert isinstance(storage, SQLiteCounterStorage)
    runs: list[Any] = []
    real_run = storage._group.run
    storage._group.run = lambda work, params: runs.append(params) or real_run(work, params)  # type: ignore[method-assign]
    hold = limits.admit(ctx, 10)
    assert len(runs) == 1 and len(runs[0]) == 2  # the tpm reservation and the rpm hit, together
    assert hold is not None and storage.get(hold.key) == 20


def test_a_request_counted_before_its_stored_conversation_loads_is_counted_once(make_limits: Any) -> None:
    """The rpm is checked before a stored conversation is loaded (``count_request``),
    and the admission that follows (``counted=True``) doesn't count the request again."""
    limits = make_limits()
    ctx = key(rpm=2, tpm=1000)
    for _ in range(2):
        limits.count_request(ctx)
        hold = limits.admit(ctx, 10, counted=True)
        assert hold is not None and hold.tokens == 10
    with pytest.raises(RateLimitError, match="requests per minute"):
        limits.count_request(ctx)
    with pytest.raises(RateLimitError, match="requests per minute"):
        limits.admit(ctx, 10)


def test_count_request_is_free_for_a_key_without_rpm(make_limits: Any) -> None:
    limits = make_limits()
    limits.count_request(key(tpm=100))
    assert limits.storage is None
