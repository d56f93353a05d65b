"""``ruff check``, ``ruff format --check`` and ``mypy`` are part of the test suite, so CI keeps the code
lint-clean, formatted and type-checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_is_clean() -> None:
    if (
        shutil.which("ruff") is None
        and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0
    ):
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_applied() -> None:
    """``ruff format --check``: one layout everywhere, so diffs show changes, not style."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean() -> None:
    """``python -m mypy`` with the repository's configuration (setup.cfg ``[mypy]``: the package, strict on the
    pure core and the pipeline) reports zero errors."""
    if subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True).returncode != 0:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    done = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
