"""Usage -> cost, and US dollars <-> integer micro-dollars. PURE: no I/O, no clock.

Money is integers: every amount the gateway stores or compares is micro-USD (``int``).
A model's ``Price`` is in USD per million tokens, which is the same number as micro-USD per
token, so a cost is ``tokens × price`` with exact ``Decimal`` arithmetic, rounded once per
request (Chat Completions reference, "Request and response": thinking tokens are billed as
output).

- ``cost_micros``: what a finished request costs (settled into the ledger).
- ``worst_case_micros``: what a request may cost at most (reserved before it runs).
- ``capped_usage``: the usage billed, never past the bounds that reservation was made from.
- ``usd_to_micros`` / ``micros_to_usd``: the dollar strings of the CLI and of ``--json``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from decimal import ROUND_CEILING, ROUND_HALF_UP, Context, Decimal

from ezat_compat.domain import Price, Usage

MICROS_PER_USD = 1_000_000
MAX_MICROS = 2**63 - 1  # what a BIGINT column holds

# Enough digits that no product or sum of realistic counts and prices is ever rounded early.
_EXACT = Context(prec=80)
_ONE = Decimal(1)
_USD = re.compile(r"(\d+)(?:\.(\d+))?")


def cost_micros(usage: Usage, price: Price) -> int:
    """The cost of one request in micro-USD, rounded half-up once.

    Uncached input at ``price.input``, cache writes at ``price.cache_write``, cache reads at
    ``price.cache_read`` and output at ``price.output``. ``usage.output_tokens`` already
    includes the thinking tokens, so ``reasoning_tokens`` is informative only and never added
    again. Raises ``ValueError`` for a negative count (a bug in the caller's usage parsing).
    """
    counts = (usage.input_tokens, usage.cache_write_tokens, usage.cache_read_tokens, usage.output_tokens)
    if min(counts) < 0:
        raise ValueError(f"token counts must not be negative: {usage!r}")
    total = _EXACT.add(
        _EXACT.add(
            _EXACT.multiply(Decimal(usage.input_tokens), price.input),
            _EXACT.multiply(Decimal(usage.cache_write_tokens), price.cache_write),
        ),
        _EXACT.add(
            _EXACT.multiply(Decimal(usage.cache_read_tokens), price.cache_read),
            _EXACT.multiply(Decimal(usage.output_tokens), price.output),
        ),
    )
    if usage.web_searches > 0:  # a price per search, in USD: micro-USD per search is a million times it
        total = _EXACT.add(total, _EXACT.multiply(Decimal(usage.web_searches) * 1_000_000, price.web_search))
    return int(total.quantize(_ONE, rounding=ROUND_HALF_UP, context=_EXACT))


def worst_case_micros(
    input_tokens_upper_bound: int, max_output_tokens: int, price: Price, web_searches: int = 0
) -> int:
    """The most a request can cost, in micro-USD, rounded up: reserve this before sending it.

    Every input token is priced at the highest of the input, cache-write and cache-read prices
    (the prompt may be written to the cache), plus ``max_output_tokens`` at the output price,
    plus ``web_searches`` (the most the request may run) at the price per search. Pass true upper
    bounds, so that settling never debits more than was reserved. Raises ``ValueError`` for
    negative counts.
    """
    if input_tokens_upper_bound < 0 or max_output_tokens < 0 or web_searches < 0:
        raise ValueError(
            f"counts must not be negative: input={input_tokens_upper_bound}, output={max_output_tokens}, "
            f"web searches={web_searches}"
        )
    input_price = max(price.input, price.cache_write, price.cache_read)
    total = _EXACT.add(
        _EXACT.multiply(Decimal(input_tokens_upper_bound), input_price),
        _EXACT.multiply(Decimal(max_output_tokens), price.output),
    )
    if web_searches:
        total = _EXACT.add(total, _EXACT.multiply(Decimal(web_searches) * 1_000_000, price.web_search))
    return int(total.quantize(_ONE, rounding=ROUND_CEILING, context=_EXACT))


def capped_usage(usage: Usage, input_bound: int, max_output_tokens: int, web_searches: int) -> Usage:
    """``usage`` held to the bounds its reservation was computed from (``worst_case_micros``'s
    arguments): prompt tokens (input, cache writes and reads together) at most ``input_bound``,
    output at most ``max_output_tokens`` (0: no output bound known), searches at most
    ``web_searches``. Returns ``usage`` itself when it is within them, so the caller can tell an
    upstream that reported more than the request could have used (an upstream fault: billed at
    the cap, never past the reservation). Prompt tokens past the bound are taken off the dearest
    kind first (cache writes, then uncached input, then cache reads)."""
    over_prompt = usage.prompt_tokens - max(0, input_bound)
    over_output = max_output_tokens > 0 and usage.output_tokens > max_output_tokens
    over_search = usage.web_searches > max(0, web_searches)
    if over_prompt <= 0 and not over_output and not over_search:
        return usage
    counts = [usage.cache_write_tokens, usage.input_tokens, usage.cache_read_tokens]
    for i, count in enumerate(counts):
        cut = min(count, max(0, over_prompt))
        counts[i] = count - cut
        over_prompt -= cut
    output = min(usage.output_tokens, max_output_tokens) if max_output_tokens > 0 else usage.output_tokens
    return replace(
        usage,
        cache_write_tokens=counts[0],
        input_tokens=counts[1],
        cache_read_tokens=counts[2],
        output_tokens=output,
        reasoning_tokens=min(usage.reasoning_tokens, output),
        web_searches=min(usage.web_searches, max(0, web_searches)),
    )


def usd_to_micros(text: str) -> int:
    """Parse a dollar amount such as ``"10"``, ``"0.5"`` or ``"0.000123"`` into micro-USD.

    Accepts digits with an optional point and at most 6 decimals, surrounding spaces ignored.
    Raises ``ValueError`` with a message fit for the operator for anything else: negative
    amounts, NaN or infinity, exponents, signs, more than 6 decimals (a micro-dollar is the
    smallest unit), or an amount too large to store.
    """
    cleaned = text.strip() if isinstance(text, str) else ""
    if not isinstance(text, str) or not cleaned:
        raise ValueError(f"{text!r} is not an amount in US dollars; write it like 10 or 0.50")
    if cleaned.startswith("-"):
        raise ValueError(f"{text!r}: the amount must not be negative")
    if cleaned.lstrip("+").lower() in {"nan", "snan", "inf", "infinity"}:
        raise ValueError(f"{text!r}: the amount must be a finite number of US dollars, like 10 or 0.50")
    match = _USD.fullmatch(cleaned)
    if match is None:
        raise ValueError(
            f"{text!r} is not an amount in US dollars; write digits with an optional decimal point, like 10 or 0.000123"
        )
    whole, fraction = match.group(1), match.group(2) or ""
    if len(fraction) > 6:
        raise ValueError(f"{text!r}: at most 6 decimals are allowed (the smallest unit is 0.000001 USD)")
    micros = int(whole) * MICROS_PER_USD + int(fraction.ljust(6, "0"))
    if micros > MAX_MICROS:
        raise ValueError(f"{text!r}: the amount is too large (at most {micros_to_usd(MAX_MICROS)} USD)")
    return micros


def micros_to_usd(micros: int) -> str:
    """Format micro-USD as a dollar string with exactly 6 decimals: ``"0.000123"``, ``"-1.500000"``."""
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(micros), MICROS_PER_USD)
    return f"{sign}{whole}.{fraction:06d}"
