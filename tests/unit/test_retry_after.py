"""The delay an upstream's answer asks for (``errors.parse_retry_after``), as a table: Azure's
(Microsoft Foundry's) millisecond headers first, then ``retry-after`` in seconds."""

from __future__ import annotations

import pytest

from ezat_compat.errors import UpstreamStatusError, parse_retry_after


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"retry-after": "12"}, 12.0, id="seconds"),
        pytest.param({"retry-after": "0.5"}, 0.5, id="fractional-seconds"),
        pytest.param({"retry-after-ms": "1500"}, 1.5, id="azure-milliseconds"),
        pytest.param({"x-ms-retry-after-ms": "250"}, 0.25, id="azure-x-ms-milliseconds"),
        pytest.param({"retry-after-ms": "1500", "retry-after": "2"}, 1.5, id="milliseconds-are-more-precise"),
        pytest.param({"retry-after-ms": "soon", "retry-after": "2"}, 2.0, id="a-bad-ms-value-falls-back"),
        pytest.param({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}, None, id="http-date-ignored"),
        pytest.param({"retry-after": "-3"}, None, id="negative"),
        pytest.param({"retry-after": "nan"}, None, id="nan"),
        pytest.param({}, None, id="none"),
    ],
)
def test_the_delay_an_upstream_asks_for(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_an_upstream_answer_reads_its_headers_in_any_case() -> None:
    error = UpstreamStatusError(429, b"{}", {"Retry-After-Ms": "2000", "Retry-After": "9"})
    assert error.upstream_retry_after == 2.0
