"""The process environment as a test wants it."""

from __future__ import annotations

import pytest

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


def without_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable in either case (requests reads both), for the rest of the test."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
