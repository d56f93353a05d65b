"""Money as the Admin API writes it: decimal strings in minor units (US cents), for the gateway's
integer micro-USD (``pricing.py``). One cent is 10,000 micro-USD, so an amount in micro-USD is a
whole number of cents with at most 4 decimals: ``1_234_500`` micro-USD is ``"123.45"`` cents.

Anthropic's spend limits take whole cents (``"50000"`` is $500.00) and its cost reports fractional
cents; our balances and top-ups (an extension) take and show up to 4 decimals, the smallest unit
the gateway keeps.
"""

from __future__ import annotations

import re

from ezat_compat.pricing import MAX_MICROS

MICROS_PER_CENT = 10_000
_CENTS = re.compile(r"([0-9]{1,18})(?:\.([0-9]{1,4}))?")


def micros_to_cents(micros: int) -> str:
    """``1_234_500`` -> ``"123.45"``; whole cents without a point (``"100"``); negative with ``-``."""
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), MICROS_PER_CENT)
    if not fraction:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{fraction:04d}".rstrip("0")


def cents_to_micros(text: object, name: str = "amount") -> int:
    """A non-negative amount of US cents as a decimal string (``"5000"``, ``"0.0123"``) in
    micro-USD. Raises ``ValueError`` naming ``name`` for anything else: a number that isn't a
    string, a sign, an exponent, more than 4 decimals (below a micro-dollar), too large."""
    if not isinstance(text, str):
        raise ValueError(f'{name}: write the amount as a string of US cents, like "5000" for $50.00')
    match = _CENTS.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f'{name}: {text!r} is not an amount of US cents; write digits with at most 4 decimals, like "5000"'
        )
    micros = int(match.group(1)) * MICROS_PER_CENT + int((match.group(2) or "").ljust(4, "0"))
    if micros > MAX_MICROS:
        raise ValueError(f"{name}: {text!r} is too large")
    return micros
