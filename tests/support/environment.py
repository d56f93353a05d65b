"""The process environment as a test wants it: no proxy variables, and Claude Code's quiet variables
(``QUIET_ENV``) for the tests that run it (tests/client/)."""

from __future__ import annotations

import pytest

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")

# Only loopback: no telemetry, error reports, update checks or other non-essential traffic.
QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "NO_PROXY": "127.0.0.1,localhost",
}


def without_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable in either case (requests reads both), for the rest of the test."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
