"""The bill never passes the reservation: ``pricing.capped_usage`` holds the usage
to the bounds the reservation was computed from, so ``cost_micros(capped) <= worst_case_micros``
whatever an upstream reports."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ezat_compat.domain import Price, Usage
from ezat_compat.pricing import capped_usage, cost_micros, worst_case_micros

PRICE = Price(input=Decimal(3), output=Decimal(15), cache_write=Decimal("3.75"), cache_read=Decimal("0.3"))


@pytest.mark.parametrize(
    ("usage", "bound", "max_tokens", "searches", "expected"),
    [
        pytest.param(Usage(input_tokens=10, output_tokens=16), 100, 16, 0, None, id="within-is-itself"),
        pytest.param(
            Usage(input_tokens=5, output_tokens=10**9),
            100,
            16,
            0,
            Usage(input_tokens=5, output_tokens=16),
            id="output-past-max-tokens",
        ),
        pytest.param(
            Usage(input_tokens=50, cache_write_tokens=50, cache_read_tokens=50, output_tokens=1),
            100,
            16,
            0,
            Usage(input_tokens=50, cache_write_tokens=0, cache_read_tokens=50, output_tokens=1),
            id="prompt-past-bound-dearest-first",
        ),
        pytest.param(
            Usage(input_tokens=5, output_tokens=40, reasoning_tokens=40),
            100,
            16,
            0,
            Usage(input_tokens=5, output_tokens=16, reasoning_tokens=16),
            id="reasoning-within-output",
        ),
        pytest.param(
            Usage(input_tokens=5, output_tokens=1, web_searches=9),
            100,
            16,
            2,
            Usage(input_tokens=5, output_tokens=1, web_searches=2),
            id="searches",
        ),
        pytest.param(Usage(input_tokens=5, output_tokens=99), 100, 0, 0, None, id="no-output-bound"),
    ],
)
def test_capped_usage(usage: Usage, bound: int, max_tokens: int, searches: int, expected: Usage | None) -> None:
    capped = capped_usage(usage, bound, max_tokens, searches)
    if expected is None:
        assert capped is usage
    else:
        assert capped == expected


counts = st.integers(min_value=0, max_value=10**12)


@given(
    counts,
    counts,
    counts,
    counts,
    st.integers(0, 10**6),
    st.integers(1, 10**6),
    st.integers(0, 50),
    st.integers(0, 10**3),
)
def test_the_capped_cost_never_passes_the_reservation(
    inp: int, write: int, read: int, out: int, bound: int, max_tokens: int, searches: int, used_searches: int
) -> None:
    price = PRICE
    usage = Usage(
        input_tokens=inp,
        cache_write_tokens=write,
        cache_read_tokens=read,
        output_tokens=out,
        web_searches=used_searches,
    )
    capped = capped_usage(usage, bound, max_tokens, searches)
    assert cost_micros(capped, price) <= worst_case_micros(bound, max_tokens, price, searches)
