"""Per-key rate limits as every backend keeps them: ``key`` makes a key's context, and the
``test_*`` functions below take a ``make_limits`` factory of ``RateLimits``.
tests/unit/test_limits.py runs them on the embedded counters (its ``make_limits`` fixture);
tests/integration/test_limits.py calls them with one on Redis."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from ezat_compat.errors import RateLimitError
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


def test_tpm_reserves_at_admission_and_settles_to_the_real_count(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(10, tpm=100)
    first = limits.admit(ctx, 60)
    assert first is not None and first.tokens == 60
    with pytest.raises(RateLimitError) as caught:  # 60 held + 50 > 100: refused while the first runs
        limits.admit(ctx, 50)
    assert caught.value.message.startswith("Rate limit reached for tokens per minute (100): ")
    assert "40 of its 100 tokens left" in caught.value.message
    assert caught.value.retry_after is not None and 1 <= caught.value.retry_after <= 60
    limits.settle_tokens(first, 20)  # it used 20: 80 are free again
    second = limits.admit(ctx, 80)
    with pytest.raises(RateLimitError):
        limits.admit(ctx, 1)
    limits.settle_tokens(second, 0)  # a failed request counts nothing
    limits.admit(ctx, 80)


def test_tpm_refuses_a_request_that_can_never_fit(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(15, tpm=100)
    with pytest.raises(RateLimitError) as caught:
        limits.admit(ctx, 101)
    assert caught.value.message.startswith("Request too large for tokens per minute (100): ")
    assert "up to 101" in caught.value.message and caught.value.retry_after is None
    limits.admit(ctx, 100)  # nothing was held by the refusal


def test_tpm_refusal_does_not_spend_a_request(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(11, rpm=1, tpm=10)
    limits.admit(replace(ctx, rpm=None), 10)
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limits.admit(ctx, 1)
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limits.admit(ctx)  # an unbilled request is refused once the minute's tokens are used
    # The rpm budget is untouched: only the tokens refused the request.
    unlimited_tokens = replace(ctx, tpm=None)
    limits.admit(unlimited_tokens)
    with pytest.raises(RateLimitError, match="requests per minute"):
        limits.admit(unlimited_tokens)


def test_rpm_refusal_gives_the_tokens_back(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(16, rpm=1, tpm=100)
    limits.admit(ctx, 10)
    with pytest.raises(RateLimitError, match="requests per minute"):
        limits.admit(ctx, 50)
    limits.admit(replace(ctx, rpm=None), 90)  # 10 held, 90 free: the refused 50 were taken back


def test_tpm_is_exact_under_concurrent_admissions(make_limits: Any) -> None:
    limits = make_limits()
    ctx = key(17, tpm=2000)
    admitted: list[int] = []
    lock = threading.Lock()

    def one(tokens: int) -> None:
        try:
            limits.admit(ctx, tokens)
        except RateLimitError:
            return
        with lock:
            admitted.append(tokens)

    threads = [threading.Thread(target=one, args=(90 + 7 * (i % 5),)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert admitted and sum(admitted) <= 2000 < sum(admitted) + 118, admitted
