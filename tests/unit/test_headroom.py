"""A deployment's own limits as its answers report them (``upstream/headroom.py``), by tables, and
the simulator's request bucket (``sim/ratelimit.py``) that reports them as Anthropic's API does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ezat_compat.sim.ratelimit import OVER_LIMIT, RateLimitedError, RequestBucket, rfc3339
from ezat_compat.upstream.headroom import LOW_FOR_MAX_S, LOW_FOR_S, Headroom, read, reset_at

NOW = datetime(2026, 12, 6, 21, 30, tzinfo=UTC).timestamp()


def _at(seconds: float) -> str:
    return rfc3339(NOW + seconds)


def _requests(remaining: str, limit: str | None = "50", reset: str | None = None) -> dict[str, str]:
    headers = {"anthropic-ratelimit-requests-remaining": remaining}
    if limit is not None:
        headers["anthropic-ratelimit-requests-limit"] = limit
    if reset is not None:
        headers["anthropic-ratelimit-requests-reset"] = reset
    return headers


@pytest.mark.parametrize(
    ("headers", "seen", "until"),
    [
        pytest.param({}, [], None, id="bedrock-or-vertex-none"),
        pytest.param(_requests("49", reset=_at(1)), [("requests", 49)], None, id="room"),
        pytest.param(_requests("3", reset=_at(7)), [("requests", 3)], None, id="six-percent-left"),
        pytest.param(_requests("2", reset=_at(8)), [("requests", 2)], NOW + 8, id="four-percent-left"),
        pytest.param(_requests("0", limit=None, reset=_at(4)), [("requests", 0)], NOW + 4, id="spent-no-limit"),
        pytest.param(_requests("5", limit=None, reset=_at(4)), [("requests", 5)], None, id="some-left-no-limit"),
        pytest.param(_requests("0", reset=_at(-3)), [("requests", 0)], NOW + LOW_FOR_S, id="reset-passed"),
        pytest.param(_requests("0", reset=_at(3600)), [("requests", 0)], NOW + LOW_FOR_MAX_S, id="reset-far"),
        pytest.param(_requests("0", reset="soon"), [("requests", 0)], NOW + LOW_FOR_S, id="reset-unreadable"),
        pytest.param(
            _requests("0", reset="2026-12-06T21:30:05"), [("requests", 0)], NOW + LOW_FOR_S, id="reset-no-offset"
        ),
        pytest.param(_requests("many"), [], None, id="remaining-unreadable"),
        pytest.param(
            {
                **_requests("40", reset=_at(2)),
                "anthropic-ratelimit-tokens-limit": "80000",
                "anthropic-ratelimit-tokens-remaining": "0",
                "anthropic-ratelimit-tokens-reset": _at(9),
                "anthropic-ratelimit-output-tokens-limit": "16000",
                "anthropic-ratelimit-output-tokens-remaining": "0",
                "anthropic-ratelimit-output-tokens-reset": _at(20),
            },
            [("requests", 40), ("tokens", 0), ("output-tokens", 0)],
            NOW + 20,
            id="the-latest-of-two-spent",
        ),
        pytest.param(
            {
                "anthropic-ratelimit-tokens-limit": "500000",
                "anthropic-ratelimit-tokens-remaining": "90000",
                "anthropic-ratelimit-input-tokens-limit": "400000",
                "anthropic-ratelimit-input-tokens-remaining": "19000",
                "anthropic-ratelimit-input-tokens-reset": "2026-12-06T21:30:12+00:00",
            },
            [("tokens", 90000), ("input-tokens", 19000)],
            NOW + 12,
            id="input-tokens-low-offset-form",
        ),
        pytest.param(
            {"anthropic-ratelimit-input-tokens-remaining": "0"},
            [],
            None,
            id="without-requests-or-tokens-nothing-is-read",
        ),
    ],
)
def test_what_an_answer_says_of_its_limits(
    headers: dict[str, str], seen: list[tuple[str, int]], until: float | None
) -> None:
    assert read(headers, NOW) == (seen, until)


def test_reset_is_rfc3339_with_an_offset() -> None:
    assert reset_at("2026-12-06T21:30:00Z") == NOW
    assert reset_at("2026-12-06T22:30:00+01:00") == NOW
    assert reset_at("") is reset_at(None) is reset_at("21:30") is None


def test_a_low_deployment_is_tried_after_the_others_until_its_reset() -> None:
    headroom = Headroom()
    order = ["a", "b", "c"]
    assert headroom.last(order, str, NOW) is order  # nothing known: the order as planned, not copied
    assert headroom.learn("a", _requests("1", reset=_at(10)), NOW) == [("requests", 1)]
    assert headroom.last(order, str, NOW) == ["b", "c", "a"]
    headroom.learn("b", _requests("0", reset=_at(5)), NOW)
    assert headroom.last(order, str, NOW) == ["c", "a", "b"]  # the low ones keep their own order
    assert headroom.last(order, str, NOW + 6) == ["b", "c", "a"]  # b's limit has refilled
    assert headroom.last(["c"], str, NOW) == ["c"]
    headroom.learn("a", {}, NOW + 1)  # an answer without the headers says nothing: a stays low
    assert headroom.last(order, str, NOW + 6) == ["b", "c", "a"]
    headroom.learn("a", _requests("30", reset=_at(12)), NOW + 7)  # room again
    assert headroom.last(order, str, NOW + 7) is order
    assert headroom._until == {}  # every mark gone once none applies


def test_a_single_deployment_is_served_as_before() -> None:
    headroom = Headroom()
    headroom.learn("a", _requests("0", reset=_at(30)), NOW)
    assert headroom.last(["a"], str, NOW) == ["a"]


def test_the_bucket_refills_continuously_and_refuses_past_its_limit() -> None:
    now = [NOW]
    bucket = RequestBucket(2, clock=lambda: now[0])
    assert dict(bucket.take()) == {
        "anthropic-ratelimit-requests-limit": "2",
        "anthropic-ratelimit-requests-remaining": "1",
        "anthropic-ratelimit-requests-reset": _at(30),
    }
    assert dict(bucket.take())["anthropic-ratelimit-requests-remaining"] == "0"
    with pytest.raises(RateLimitedError) as refused:
        bucket.take()
    assert refused.value.status == 429 and refused.value.error_type == "rate_limit_error"
    assert refused.value.message == OVER_LIMIT and refused.value.retry_after == 30
    assert dict(refused.value.headers)["anthropic-ratelimit-requests-reset"] == _at(60)
    now[0] += 15  # half a request back: still refused, sooner
    with pytest.raises(RateLimitedError) as again:
        bucket.take()
    assert again.value.retry_after == 15
    now[0] += 15
    assert dict(bucket.take())["anthropic-ratelimit-requests-remaining"] == "0"
    now[0] += 600  # never more than the limit
    assert dict(bucket.take())["anthropic-ratelimit-requests-remaining"] == "1"


def test_a_bucket_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RequestBucket(0, lambda: NOW)
