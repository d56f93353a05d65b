"""Per-key rate limits in one process on the embedded SQLite counters: rpm, tpm, unlimited keys,
window resets.

tests/integration/test_limits.py runs the behaviour tests below on Redis too, and the tests
that need a second process (exact rpm across processes, counters across a fork).
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
from ezat_compat.store.accounts import AuthContext


def key(key_id: int = 1, *, rpm: int | None = None, tpm: int | None = None) -> AuthContext:
    return AuthContext(
        key_id=key_id,
        key_public_id=f"key_{key_id:012x}",
        org_id=1,
        org_name="acme",
        model_patterns=(),
        spend_limit_micros=None,
        rpm=rpm,
        tpm=tpm,
    )


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


def test_rpm_refusal_says_what_and_when(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(8, rpm=2)
    limits.admit(ctx)
    limits.admit(ctx)
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx)
    assert caught.value.status == 429
    assert caught.value.message.startswith(f"Rate limit reached for requests per minute (2): key {ctx.key_public_id}")
    assert caught.value.retry_after is not None and 1 <= caught.value.retry_after <= 60
    # Another key has its own budget.
    limits.admit(key(9, rpm=2))


def test_tpm_window_exhausted_after_record_tokens(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(10, tpm=100)
    limits.admit(ctx)
    limits.record_tokens(ctx, 60)
    limits.admit(ctx)  # 60 of 100 used: still admitted
    limits.record_tokens(ctx, 50)  # the budget may be overrun by the request that was running
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx)
    assert caught.value.message.startswith("Rate limit reached for tokens per minute (100): ")
    assert caught.value.retry_after is not None and caught.value.retry_after >= 1


def test_tpm_refusal_does_not_spend_a_request(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(11, rpm=1, tpm=10)
    limits.record_tokens(ctx, 10)
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limits.admit(ctx)
    # The rpm budget is untouched: only the tokens refused the request.
    unlimited_tokens = replace(ctx, tpm=None)
    limits.admit(unlimited_tokens)
    with pytest.raises(RateLimitError, match="requests per minute"):
        limits.admit(unlimited_tokens)


@pytest.mark.parametrize("backend_kind", ["embedded", "redis"])
def test_unlimited_keys_never_touch_storage(tmp_path: Path, backend_kind: str) -> None:
    # Neither storage exists: an unreachable Redis port, a folder that isn't there.
    missing = tmp_path / "missing" / "limits.db"
    url = "redis://127.0.0.1:1/15" if backend_kind == "redis" else None
    limits = RateLimits(url, str(missing))
    for _ in range(100):
        limits.admit(key(12))
        limits.record_tokens(key(12), 1_000_000)
    limits.record_tokens(key(12, rpm=5), 1_000)  # rpm only: tokens aren't counted either
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

    limits.record_tokens(ctx, 80)
    clock.now += 1
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limits.admit(replace(ctx, rpm=None))
    clock.now += 60
    limits.admit(replace(ctx, rpm=None))
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
