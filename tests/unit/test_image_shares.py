"""Fair shares of the image download pool (Chat Completions reference, "Images and PDFs": EZAT
downloads a request's http(s) image URLs itself, within the request's 15 seconds).

``Shares`` hands out the pool's places: at most ``per_org`` to one organization, the next free
place to the waiter whose organization holds fewest (then whose request holds fewest, then the
earliest), and a waiter over its organization's share holds up nobody. ``ImageFetcher._run``
runs a request's jobs on at most ``request_threads`` of them. Real threads, no I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ezat_compat.config import ConfigError, load_config
from ezat_compat.upstream.image_limits import ORG_BUSY, POOL_BUSY
from ezat_compat.upstream.image_shares import GAVE_UP, GRANTED, Shares
from ezat_compat.upstream.images import ImageFetcher

SOON = 0.05  # a deadline that passes at once


def later(seconds: float = SOON) -> float:
    return time.monotonic() + seconds


def never() -> bool:
    return False


class Waiting:
    """``shares.acquire`` in a thread; ``outcome`` once it returns."""

    def __init__(self, shares: Shares, org: str, held: int = 0, timeout_s: float = 5) -> None:
        self.outcome = ""
        self.done = threading.Event()
        self.flag = False
        self._thread = threading.Thread(target=self._run, args=(shares, org, held, timeout_s), daemon=True)
        self._thread.start()

    def _run(self, shares: Shares, org: str, held: int, timeout_s: float) -> None:
        self.outcome = shares.acquire(org, held, later(timeout_s), lambda: self.flag)
        self.done.set()


def settle() -> None:
    time.sleep(0.1)  # the waiting threads reach their wait


@pytest.mark.parametrize(
    ("total", "per_org", "held", "org", "expected"),
    [
        (4, 2, {"a": 1}, "a", GRANTED),
        (4, 2, {"a": 2}, "a", ORG_BUSY),  # its share is taken
        (4, 2, {"a": 2}, "b", GRANTED),  # another organization isn't held up by it
        (4, 2, {"a": 2, "b": 2}, "c", POOL_BUSY),  # every place is taken
        (4, 9, {"a": 4}, "a", ORG_BUSY),  # the share is at most the pool
        (3, 0, {}, "a", GRANTED),  # and at least one place
    ],
)
def test_a_place_is_granted_within_the_pool_and_the_orgs_share(total, per_org, held, org, expected):
    shares = Shares(total, per_org)
    for holder, count in held.items():
        for _ in range(count):
            assert shares.acquire(holder, 0, later(), never) == GRANTED
    # A deadline already past: a place is granted only if it is free at once, never after a wait.
    assert shares.acquire(org, 0, time.monotonic(), never) == expected


def test_a_released_place_goes_to_the_waiting_org_that_holds_fewest_not_the_earliest():
    shares = Shares(2, 2)
    for _ in range(2):
        assert shares.acquire("a", 0, later(), never) == GRANTED
    first = Waiting(shares, "a")
    settle()
    second = Waiting(shares, "b")
    settle()
    shares.release("a")  # a holds 1, b none: b goes first
    assert second.done.wait(2) and second.outcome == GRANTED
    assert not first.done.is_set()
    shares.release("b")  # a holds 1, b none, but only a waits
    assert first.done.wait(2) and first.outcome == GRANTED
    assert (shares.held_by("a"), shares.held_by("b")) == (2, 0)


def test_within_an_org_the_request_that_holds_fewest_goes_first():
    shares = Shares(2, 2)
    for _ in range(2):
        assert shares.acquire("a", 0, later(), never) == GRANTED
    wide = Waiting(shares, "a", held=2)
    settle()
    narrow = Waiting(shares, "a", held=0)
    settle()
    shares.release("a")
    assert narrow.done.wait(2) and narrow.outcome == GRANTED
    assert not wide.done.is_set()
    shares.release("a")
    assert wide.done.wait(2) and wide.outcome == GRANTED


def test_a_waiter_over_its_orgs_share_does_not_hold_up_another_org():
    shares = Shares(4, 2)
    for _ in range(2):
        assert shares.acquire("a", 0, later(), never) == GRANTED
    blocked = Waiting(shares, "a", timeout_s=0.5)
    settle()
    for _ in range(2):  # at once (a deadline already past), though a's waiter is in line first
        assert shares.acquire("b", 0, time.monotonic(), never) == GRANTED
    assert blocked.done.wait(2) and blocked.outcome == ORG_BUSY


def test_a_waiter_gives_up_when_poked_and_its_reason_is_gone():
    shares = Shares(1, 1)
    assert shares.acquire("a", 0, later(), never) == GRANTED
    waiting = Waiting(shares, "b")
    settle()
    waiting.flag = True
    shares.poke()
    assert waiting.done.wait(1) and waiting.outcome == GAVE_UP
    assert shares.held_by("b") == 0


def test_a_waiter_that_left_lets_the_next_in_line_through():
    """The first in line times out: the place it would have had goes to the next one."""
    shares = Shares(1, 1)
    assert shares.acquire("a", 0, later(), never) == GRANTED
    short = Waiting(shares, "b", timeout_s=0.2)
    settle()
    patient = Waiting(shares, "c")
    assert short.done.wait(2) and short.outcome == POOL_BUSY
    shares.release("a")
    assert patient.done.wait(2) and patient.outcome == GRANTED


# ---------------------------------------------------------------- a request's lanes


@pytest.fixture
def make_fetcher() -> Iterator[Callable[..., ImageFetcher]]:
    made: list[ImageFetcher] = []

    def make(**kwargs: int) -> ImageFetcher:
        fetcher = ImageFetcher(allow_private=False, **kwargs)  # type: ignore[arg-type]
        made.append(fetcher)
        return fetcher

    yield make
    for fetcher in made:
        fetcher.close()


def counting_jobs(count: int, seconds: float) -> tuple[list[Callable[[], int]], Callable[[], int]]:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def job(i: int) -> int:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(seconds)
        with lock:
            state["now"] -= 1
        return i

    return [lambda i=i: job(i) for i in range(count)], lambda: state["peak"]


@pytest.mark.parametrize(
    ("threads", "org_threads", "request_threads", "peak"),
    [(8, 8, 3, 3), (8, 2, 8, 2), (2, 8, 8, 2), (8, 8, 8, 6)],
)
def test_a_request_runs_at_most_its_share_of_the_pool(make_fetcher, threads, org_threads, request_threads, peak):
    fetcher = make_fetcher(threads=threads, org_threads=org_threads, request_threads=request_threads)
    jobs, seen_peak = counting_jobs(6, 0.05)
    lanes = fetcher._run(jobs, "a", later(5), lambda: None)
    assert lanes.results == list(range(6))
    assert seen_peak() == peak
    _executor, shares = fetcher._executor_for_this_process()
    assert wait_until(lambda: shares.held_by("a") == 0)


def test_the_first_failure_stops_the_other_jobs_and_frees_the_places(make_fetcher):
    fetcher = make_fetcher(threads=4, org_threads=4, request_threads=1)
    stopped = threading.Event()
    ran: list[int] = []

    def job(i: int) -> int:
        ran.append(i)
        if i == 1:
            raise ValueError("boom")
        return i

    lanes = fetcher._run([lambda i=i: job(i) for i in range(4)], "a", later(5), stopped.set)
    assert ran == [0, 1] and stopped.is_set()
    assert isinstance(lanes.errors[1], ValueError) and lanes.results[:1] == [0]
    _executor, shares = fetcher._executor_for_this_process()
    assert wait_until(lambda: shares.held_by("a") == 0)


def test_a_request_that_never_gets_a_place_waits_until_its_deadline_only(make_fetcher):
    fetcher = make_fetcher(threads=2, org_threads=1, request_threads=2)
    _executor, shares = fetcher._executor_for_this_process()
    assert shares.acquire("a", 0, later(), never) == GRANTED
    started = time.monotonic()
    lanes = fetcher._run([lambda: 1], "a", later(0.3), lambda: None)
    assert 0.25 < time.monotonic() - started < 1
    assert (lanes.results, lanes.denied, lanes.started(0)) == ([None], ORG_BUSY, False)
    assert fetcher._run([lambda: 2], "b", later(0.3), lambda: None).results == [2]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 2) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize("field", ["threads", "org_threads", "request_threads"])
def test_every_bound_is_at_least_one(field):
    bounds = {"threads": 4, "org_threads": 2, "request_threads": 2, field: 0}
    with pytest.raises(ValueError):
        ImageFetcher(allow_private=False, **bounds)


# ---------------------------------------------------------------- config

MINIMAL = """
[[models]]
id = "anthropic/claude-sonnet-5-5"
aliases = ["claude-sonnet-5-5"]
price = { input = 3.0, output = 15.0, cache_write = 3.75, cache_read = 0.30 }

[[models.deployments]]
name = "primary"
base_url = "https://api.anthropic.com"
upstream_model = "claude-sonnet-5-5"
"""


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [
        ("", (64, 20, 20)),
        ("image_fetch_org_threads = 8\nimage_fetch_request_threads = 4\n", (64, 8, 4)),
    ],
)
def test_the_shares_are_gateway_keys_with_defaults(tmp_path: Path, gateway: str, expected: tuple[int, int, int]):
    path = tmp_path / "ezat.toml"
    path.write_text("[gateway]\n" + gateway + MINIMAL)
    gw = load_config(path, environ={"ANTHROPIC_API_KEY": "sk-test"}).gateway
    assert (gw.image_fetch_threads, gw.image_fetch_org_threads, gw.image_fetch_request_threads) == expected


@pytest.mark.parametrize("key", ["image_fetch_org_threads", "image_fetch_request_threads"])
def test_a_share_of_zero_is_refused(tmp_path: Path, key: str):
    path = tmp_path / "ezat.toml"
    path.write_text(f"[gateway]\n{key} = 0\n" + MINIMAL)
    with pytest.raises(ConfigError, match=key):
        load_config(path, environ={"ANTHROPIC_API_KEY": "sk-test"})
