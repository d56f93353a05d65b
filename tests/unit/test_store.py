"""Storage without a database: engine URLs, key model patterns, ledger entry checks.

The tests on a real database (SQLite and PostgreSQL) are in tests/integration/test_store.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ezat_compat.store.accounts import AuthContext
from ezat_compat.store.db import make_engine
from ezat_compat.store.ledger import LedgerEntry

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def test_make_engine_refuses_other_databases() -> None:
    with pytest.raises(ValueError, match="sqlite:///PATH or postgresql"):
        make_engine("mysql://u@h/db")


ALLOWS = [
    # id, patterns, canonical id, aliases, allowed
    ("no-patterns-allow-every-model", (), "anthropic/claude-opus-5", (), True),
    ("glob-on-canonical-id", ("anthropic/claude-sonnet-*",), "anthropic/claude-sonnet-5-5", (), True),
    ("glob-other-family", ("anthropic/claude-sonnet-*",), "anthropic/claude-opus-5", ("claude-opus-5",), False),
    ("alias-listed", ("claude-haiku-4",), "anthropic/claude-haiku-4", ("claude-haiku-4",), True),
    ("glob-on-alias", ("claude-sonnet-5.*",), "anthropic/claude-sonnet-5-5", ("claude-sonnet-5.5",), True),
    ("pattern-in-upper-case", ("Anthropic/Claude-Sonnet-*",), "anthropic/claude-sonnet-5-5", (), True),
    ("model-in-upper-case", ("anthropic/claude-sonnet-*",), "ANTHROPIC/Claude-Sonnet-5-5", (), True),
    ("alias-in-mixed-case", ("claude-haiku-4",), "anthropic/claude-haiku-4", ("Claude-Haiku-4",), True),
    ("exact-id-is-not-a-prefix", ("anthropic/claude-sonnet",), "anthropic/claude-sonnet-5-5", (), False),
    ("any-of-several", ("openai/*", "anthropic/claude-opus-*"), "anthropic/claude-opus-5", (), True),
    ("question-mark", ("anthropic/claude-sonnet-5-?",), "anthropic/claude-sonnet-5-5", (), True),
    ("character-class", ("anthropic/claude-[ho]*",), "anthropic/claude-sonnet-5-5", (), False),
]


@pytest.mark.parametrize(
    ("patterns", "model", "aliases", "allowed"), [a[1:] for a in ALLOWS], ids=[a[0] for a in ALLOWS]
)
def test_allows(patterns: tuple[str, ...], model: str, aliases: tuple[str, ...], allowed: bool) -> None:
    ctx = AuthContext(
        key_id=1,
        key_public_id="key_x",
        org_id=1,
        org_name="acme",
        model_patterns=patterns,
        spend_limit_micros=None,
        rpm=None,
        tpm=None,
    )
    assert ctx.allows(model, aliases) is allowed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"endpoint": "embeddings"}, "endpoint"),
        ({"cost_micros": -1}, "negative"),
        ({"status": 42}, "HTTP status"),
    ],
    ids=["unknown-endpoint", "negative-cost", "not-a-status"],
)
def test_ledger_entry_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {
        "created_at": NOW,
        "org_id": 1,
        "key_id": 1,
        "endpoint": "messages",
        "model": "m",
        "canonical_model": "c",
        "deployment": "d",
    }
    with pytest.raises(ValueError, match=message):
        LedgerEntry(**{**base, **kwargs})
