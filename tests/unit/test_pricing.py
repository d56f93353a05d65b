"""Pricing as tables: usage -> micro-USD, worst cases, and dollar strings."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from ezat_compat.domain import Price, Usage
from ezat_compat.pricing import cost_micros, micros_to_usd, usd_to_micros, worst_case_micros


def price(input: str, output: str, cache_write: str, cache_read: str) -> Price:
    return Price(
        input=Decimal(input), output=Decimal(output), cache_write=Decimal(cache_write), cache_read=Decimal(cache_read)
    )


SONNET = price("3", "15", "3.75", "0.30")
HAIKU = price("0.80", "4", "1", "0.08")
FLAT = price("0.4", "0.4", "0.4", "0.4")
HALF = price("0.5", "0.5", "0.5", "0.5")


COSTS = [
    # id, usage, price, micro-USD
    ("zero-usage", Usage(), SONNET, 0),
    ("uncached-input", Usage(input_tokens=1000), SONNET, 3_000),
    ("output", Usage(output_tokens=1000), SONNET, 15_000),
    ("cache-write", Usage(cache_write_tokens=1000), SONNET, 3_750),
    ("cache-read", Usage(cache_read_tokens=1000), SONNET, 300),
    (
        "all-four",
        Usage(input_tokens=100, cache_write_tokens=200, cache_read_tokens=300, output_tokens=400),
        SONNET,
        300 + 750 + 90 + 6_000,
    ),
    ("reasoning-is-part-of-output-not-added-twice", Usage(output_tokens=1000, reasoning_tokens=800), SONNET, 15_000),
    ("reasoning-only-output", Usage(input_tokens=10, output_tokens=500, reasoning_tokens=500), SONNET, 30 + 7_500),
    ("one-million-output-tokens-is-the-list-price", Usage(output_tokens=1_000_000), SONNET, 15_000_000),
    ("cheap-model", Usage(input_tokens=2000, cache_read_tokens=10_000, output_tokens=300), HAIKU, 1600 + 800 + 1200),
    ("half-rounds-up", Usage(input_tokens=1), HALF, 1),
    ("below-half-rounds-down", Usage(cache_read_tokens=1), SONNET, 0),
    ("1.5-rounds-up-to-2", Usage(input_tokens=3), HALF, 2),
    ("rounded-once-per-request-not-per-part", Usage(input_tokens=1, output_tokens=1), FLAT, 1),
    # As floats, 100 × 0.145 is 14.499999999999998 and would round to 14.
    ("exact-decimal-no-float-drift", Usage(input_tokens=100), price("0.145", "0", "0", "0"), 15),
    (
        "many-small-parts-add-exactly",
        Usage(input_tokens=7, cache_write_tokens=7, cache_read_tokens=7, output_tokens=7),
        price("0.1", "0.1", "0.1", "0.1"),
        3,
    ),
    (
        "estimated-early-close",
        Usage(input_tokens=1200, cache_read_tokens=4000, output_tokens=37),
        SONNET,
        3_600 + 1_200 + 555,
    ),
    ("six-decimal-price", Usage(input_tokens=1_000_000), price("3.123456", "0", "0", "0"), 3_123_456),
]


@pytest.mark.parametrize(("usage", "prices", "expected"), [c[1:] for c in COSTS], ids=[c[0] for c in COSTS])
def test_cost_micros(usage: Usage, prices: Price, expected: int) -> None:
    got = cost_micros(usage, prices)
    assert got == expected
    assert type(got) is int


def test_cost_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="negative"):
        cost_micros(Usage(input_tokens=-1), SONNET)


WORST = [
    # id, input upper bound, max output, price, micro-USD
    ("zero", 0, 0, SONNET, 0),
    ("input-at-the-cache-write-price", 1000, 0, SONNET, 3_750),
    ("output-at-the-output-price", 0, 1000, SONNET, 15_000),
    ("both", 1000, 500, SONNET, 3_750 + 7_500),
    ("cache-write-cheaper-than-input", 1000, 0, price("2", "4", "1", "0.1"), 2_000),
    ("rounded-up-not-half-up", 1, 0, price("3", "15", "3.2", "0.3"), 4),
    ("tiny-fraction-rounds-up", 1, 0, price("0.000001", "0", "0.000001", "0"), 1),
    ("max-output-of-a-big-model", 200_000, 64_000, SONNET, 750_000 + 960_000),
]


@pytest.mark.parametrize(
    ("input_bound", "max_output", "prices", "expected"), [w[1:] for w in WORST], ids=[w[0] for w in WORST]
)
def test_worst_case_micros(input_bound: int, max_output: int, prices: Price, expected: int) -> None:
    assert worst_case_micros(input_bound, max_output, prices) == expected


@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=900, output_tokens=500),
        Usage(cache_write_tokens=900, output_tokens=500),
        Usage(cache_read_tokens=900, output_tokens=500, reasoning_tokens=400),
        Usage(input_tokens=300, cache_write_tokens=300, cache_read_tokens=300, output_tokens=500),
    ],
    ids=["uncached", "all-written", "all-read", "mixed"],
)
def test_worst_case_covers_every_split_of_the_input(usage: Usage) -> None:
    for prices in (SONNET, HAIKU, FLAT, HALF):
        assert cost_micros(usage, prices) <= worst_case_micros(900, 500, prices)


def test_worst_case_refuses_negative_counts() -> None:
    with pytest.raises(ValueError, match="negative"):
        worst_case_micros(-1, 10, SONNET)


USD_OK = [
    ("whole", "10", 10_000_000),
    ("half", "0.5", 500_000),
    ("micro", "0.000123", 123),
    ("one-micro", "0.000001", 1),
    ("zero", "0", 0),
    ("six-decimals", "10.500000", 10_500_000),
    ("spaces", "  7.25 ", 7_250_000),
    ("leading-zeros", "007", 7_000_000),
    ("large", "1000000", 1_000_000_000_000),
]


@pytest.mark.parametrize(("text", "micros"), [u[1:] for u in USD_OK], ids=[u[0] for u in USD_OK])
def test_usd_to_micros(text: str, micros: int) -> None:
    assert usd_to_micros(text) == micros


USD_REFUSED = [
    ("negative", "-1", "negative"),
    ("negative-fraction", "-0.5", "negative"),
    ("nan", "NaN", "finite"),
    ("infinity", "inf", "finite"),
    ("plus-infinity", "+Infinity", "finite"),
    ("seven-decimals", "0.0000001", "at most 6 decimals"),
    ("trailing-zero-seventh-decimal", "1.0000000", "at most 6 decimals"),
    ("exponent", "1e3", "not an amount"),
    ("garbage", "ten dollars", "not an amount"),
    ("dollar-sign", "$5", "not an amount"),
    ("comma", "1,5", "not an amount"),
    ("plus-sign", "+5", "not an amount"),
    ("underscore", "1_000", "not an amount"),
    ("dangling-point", "5.", "not an amount"),
    ("empty", "", "not an amount"),
    ("blank", "   ", "not an amount"),
    ("too-large", "99999999999999", "too large"),
]


@pytest.mark.parametrize(("text", "message"), [u[1:] for u in USD_REFUSED], ids=[u[0] for u in USD_REFUSED])
def test_usd_to_micros_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        usd_to_micros(text)


MICROS_TO_USD = [
    ("zero", 0, "0.000000"),
    ("micro", 123, "0.000123"),
    ("ten-and-a-half", 10_500_000, "10.500000"),
    ("one-dollar", 1_000_000, "1.000000"),
    ("negative", -1_500_000, "-1.500000"),
    ("negative-micro", -1, "-0.000001"),
]


@pytest.mark.parametrize(("micros", "text"), [m[1:] for m in MICROS_TO_USD], ids=[m[0] for m in MICROS_TO_USD])
def test_micros_to_usd(micros: int, text: str) -> None:
    assert micros_to_usd(micros) == text


@pytest.mark.parametrize("micros", [0, 1, 999_999, 1_000_000, 123_456_789, 2**63 - 1])
def test_round_trip(micros: int) -> None:
    assert usd_to_micros(micros_to_usd(micros)) == micros


def test_the_worst_case_covers_the_searches_a_request_may_run() -> None:
    searching = dataclasses.replace(SONNET, web_search=Decimal("0.01"))  # USD per search
    assert worst_case_micros(1000, 500, searching, web_searches=10) == 3_750 + 7_500 + 100_000
    assert cost_micros(Usage(input_tokens=1000, output_tokens=500, web_searches=10), searching) <= worst_case_micros(
        1000, 500, searching, web_searches=10
    )
    with pytest.raises(ValueError, match="negative"):
        worst_case_micros(0, 0, searching, web_searches=-1)
