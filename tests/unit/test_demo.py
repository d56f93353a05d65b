"""The demo's choice of upstream: the simulator unless ANTHROPIC_API_KEY is set and --simulator isn't given;
it says which before it starts."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "simulator, environ, anthropic, says",
    [
        (False, {}, False, "the bundled simulator (no ANTHROPIC_API_KEY"),
        (False, {"ANTHROPIC_API_KEY": "sk-ant"}, True, "pass --simulator to use the bundled simulator"),
        (True, {"ANTHROPIC_API_KEY": "sk-ant"}, False, "the bundled simulator (--simulator"),
        (True, {}, False, "the bundled simulator (no ANTHROPIC_API_KEY"),
    ],
    ids=["no-key", "key", "key-and-flag", "flag"],
)
def test_the_demo_says_which_upstream_it_uses(
    simulator: bool, environ: dict[str, str], anthropic: bool, says: str
) -> None:
    from ezat_compat.demo import upstream_notice, uses_anthropic

    assert uses_anthropic(simulator, environ) is anthropic
    assert says in upstream_notice(simulator, environ)
