"""Per-key rate limits on Redis and across processes: the unit behaviour tests on Redis (the
``redis_url`` fixture, db 15, keys under a unique prefix deleted afterwards), exact rpm across
two processes on both backends, Redis windows, and the embedded counters across a fork.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ezat_compat.errors import RateLimitError
from ezat_compat.limits import RateLimits, SQLiteCounterStorage
from ezat_compat.store.accounts import AuthContext
from tests.support import limits as single_process
from tests.support.limits import key

SPAWN = multiprocessing.get_context("spawn")
BACKENDS = ["embedded", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Keyword arguments for ``RateLimits`` on one backend, isolated from any other test."""
    if request.param == "embedded":
        yield {"redis_url": None, "embedded_path": str(tmp_path / "limits.db")}
        return
    yield from _redis_backend(request.getfixturevalue("redis_url"), tmp_path)


@pytest.fixture
def redis_backend(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Keyword arguments for ``RateLimits`` on Redis, isolated from any other test."""
    yield from _redis_backend(redis_url, tmp_path)


def _redis_backend(url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    prefix = f"ezat-test-{uuid.uuid4().hex[:12]}"
    yield {"redis_url": url, "embedded_path": str(tmp_path / "unused.db"), "key_prefix": prefix}
    client = redis.Redis.from_url(url)
    try:
        stale = list(client.scan_iter(match=f"{prefix}:*"))
        if stale:
            client.delete(*stale)
    finally:
        client.close()


@pytest.fixture
def make_limits(redis_backend: dict[str, Any]) -> Iterator[Any]:
    """Builds ``RateLimits`` on Redis (closed afterwards)."""
    made: list[RateLimits] = []

    def make(**kwargs: Any) -> RateLimits:
        limits = RateLimits(**{**redis_backend, **kwargs})
        made.append(limits)
        return limits

    yield make
    for limits in made:
        limits.close()


# ---------------------------------------------------------------- the single-process behaviour on Redis


@pytest.mark.redis
def test_rpm_refusal_says_what_and_when_on_redis(make_limits: Any) -> None:
    single_process.test_rpm_refusal_says_what_and_when(make_limits)


@pytest.mark.redis
def test_tpm_reserves_at_admission_and_settles_to_the_real_count_on_redis(make_limits: Any) -> None:
    single_process.test_tpm_reserves_at_admission_and_settles_to_the_real_count(make_limits)


@pytest.mark.redis
def test_tpm_refuses_a_request_that_can_never_fit_on_redis(make_limits: Any) -> None:
    single_process.test_tpm_refuses_a_request_that_can_never_fit(make_limits)


@pytest.mark.redis
def test_rpm_refusal_gives_the_tokens_back_on_redis(make_limits: Any) -> None:
    single_process.test_rpm_refusal_gives_the_tokens_back(make_limits)


@pytest.mark.redis
def test_tpm_is_exact_under_concurrent_admissions_on_redis(make_limits: Any) -> None:
    single_process.test_tpm_is_exact_under_concurrent_admissions(make_limits)


@pytest.mark.redis
def test_tpm_refusal_does_not_spend_a_request_on_redis(make_limits: Any) -> None:
    single_process.test_tpm_refusal_does_not_spend_a_request(make_limits)


# ---------------------------------------------------------------- across processes


def _admit_many(backend: dict[str, Any], ctx: AuthContext, n: int, start: Any, queue: Any) -> None:
    """Child process: ``n`` threads call admit at once; reports (admitted, retry_after values)."""
    limits = RateLimits(**backend)
    admitted: list[bool] = []
    waits: list[int] = []
    errors: list[str] = []
    go = threading.Barrier(n)

    def one() -> None:
        go.wait()
        try:
            limits.admit(ctx)
            admitted.append(True)
        except RateLimitError as exc:
            assert exc.retry_after is not None
            waits.append(exc.retry_after)
        except Exception as exc:
            errors.append(repr(exc))

    try:
        start.wait(timeout=60)
        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        queue.put((len(admitted), waits, errors))
    except Exception as exc:
        queue.put((0, [], [repr(exc)]))
    finally:
        limits.close()


def test_rpm_is_exact_across_two_processes(backend: dict[str, Any]) -> None:
    ctx = key(7, rpm=10)
    start, queue = SPAWN.Barrier(2), SPAWN.Queue()
    procs = [SPAWN.Process(target=_admit_many, args=(backend, ctx, 15, start, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
        queue.close()
        queue.join_thread()
    assert [p.exitcode for p in procs] == [0, 0]
    assert [e for r in results for e in r[2]] == []
    assert sum(r[0] for r in results) == 10
    waits = [w for r in results for w in r[1]]
    assert len(waits) == 20
    assert all(1 <= w <= 60 for w in waits)


@pytest.mark.redis
def test_redis_window_resets(redis_url: str) -> None:
    prefix = f"ezat-test-{uuid.uuid4().hex[:12]}"
    limits = RateLimits(redis_url, "/nonexistent/limits.db", window_s=1, key_prefix=prefix)
    ctx = key(15, rpm=3)
    try:
        for _ in range(3):
            limits.admit(ctx)
        with pytest.raises(RateLimitError) as caught:
            limits.admit(ctx)
        assert caught.value.retry_after == 1
        time.sleep(1.2)
        limits.admit(ctx)
    finally:
        limits.close()
        client = redis.Redis.from_url(redis_url)
        for name in client.scan_iter(match=f"{prefix}:*"):
            client.delete(name)
        client.close()


def _count_in_forked_child(limits: RateLimits, ctx: AuthContext, queue: Any) -> None:
    try:
        limits.admit(ctx)
        storage = limits.storage
        assert isinstance(storage, SQLiteCounterStorage)
        queue.put(f"admitted on a new connection: {len(storage._inherited) == 1}")
    except RateLimitError:
        queue.put("refused")
    except Exception as exc:
        queue.put(repr(exc))


def test_embedded_counters_survive_a_fork(tmp_path: Path) -> None:
    """gunicorn forks workers: a child drops the connection it inherited and opens its own."""
    limits = RateLimits(None, str(tmp_path / "limits.db"))
    ctx = key(16, rpm=2)
    limits.admit(ctx)  # the parent's connection is open now
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    outcomes = []
    for _ in range(2):
        child = fork.Process(target=_count_in_forked_child, args=(limits, ctx, queue))
        child.start()
        outcomes.append(queue.get(timeout=30))
        child.join(timeout=30)
        assert child.exitcode == 0
    queue.close()
    queue.join_thread()
    assert outcomes == ["admitted on a new connection: True", "refused"]
    limits.close()
