"""``Sealer.derive``: keys for other uses of the gateway's secret (the prompt-cache scope)."""

from __future__ import annotations

from ezat_compat.sealing import Sealer

KEY = bytes(range(32))


def test_a_derived_key_is_stable_per_key_and_purpose_and_is_not_the_key() -> None:
    sealer = Sealer(KEY)
    derived = sealer.derive(b"prompt-cache scope")
    assert len(derived) == 32 and derived != KEY
    assert derived == Sealer(KEY, [bytes(32)]).derive(b"prompt-cache scope")  # older keys: no part in it
    assert derived == sealer.derive(b"prompt-cache scope")
    assert derived != sealer.derive(b"another use")
    assert derived != Sealer(bytes(range(1, 33))).derive(b"prompt-cache scope")  # rotated: another
