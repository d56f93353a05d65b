"""The logging configuration of a started process: which libraries' lines it lets through, in an
interpreter of its own. The pure pieces of logs (formatting, redaction, outages) are tested in
tests/unit/test_logs.py."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.integration

_START_PATH = """
import logging, logging.config, sys
from ezat_compat.domain import LoggingSettings
from ezat_compat.server.logs import logging_config
from ezat_compat.store.db import prepare_database

logging.config.dictConfig(logging_config(LoggingSettings(format=sys.argv[1]), sys.argv[2]))
prepare_database(sys.argv[3])  # what serve's master and the demo run on start: Alembic's migrations
for name in ("sqlalchemy.engine", "urllib3.connectionpool", "ezat_compat", "gunicorn.error"):
    logging.getLogger(name).info("note from %s", name)
logging.getLogger("urllib3.connectionpool").warning("warning from urllib3")
"""


@pytest.mark.parametrize("fmt", ["json", "text"])
@pytest.mark.parametrize("level", ["info", "debug"])
def test_libraries_log_only_warnings_unless_the_level_is_debug(tmp_path: Any, fmt: str, level: str) -> None:
    """A start migrates the database: Alembic's twelve INFO lines (plugins, context, each revision) and any
    other library's notes stay out of the log at the default level; ours and gunicorn's stay in."""
    url = f"sqlite:///{tmp_path / 'ezat.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _START_PATH, fmt, level, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any("note from ezat_compat" in line for line in lines)
    assert any("note from gunicorn.error" in line for line in lines)
    assert any("warning from urllib3" in line for line in lines)
    from_libraries = [
        line for line in lines if "alembic" in line or "note from sqlalchemy" in line or "note from urllib3" in line
    ]
    if level == "debug":
        assert any("Running upgrade" in line for line in from_libraries)
    else:
        assert from_libraries == []
