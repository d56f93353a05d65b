"""The version has one source, the newest entry of CHANGELOG.md: ``ezat-compat --version``, ``__version__``
(which ``ezat_build_info`` and the upstream User-Agent report) and the built package's metadata say it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ezat_compat
from ezat_compat import changelog_version

REPO = Path(__file__).resolve().parents[2]


def newest_entry() -> str:
    """The first ``## `` heading of CHANGELOG.md, read here without the package's reader."""
    heading = next(line for line in (REPO / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    found = re.fullmatch(r"## (\d+\.\d+\.\d+) — \d{4}-\d{2}-\d{2}", heading)
    assert found, f"the newest entry's heading is '## X.Y.Z — YYYY-MM-DD', not {heading!r}"
    return found.group(1)


def test_version_is_the_changelogs_newest_entry() -> None:
    version = newest_entry()
    assert ezat_compat.__version__ == version
    done = subprocess.run(
        [sys.executable, "-m", "ezat_compat.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == f"ezat-compat {version}\n"


def test_the_upstream_user_agent_names_the_version() -> None:
    from ezat_compat.upstream.providers import USER_AGENT

    assert f"ezat-compat/{newest_entry()}" == USER_AGENT


def test_the_package_metadata_takes_the_version_from_the_package() -> None:
    assert "version = attr: ezat_compat.__version__" in (REPO / "setup.cfg").read_text().splitlines()
    assert "include CHANGELOG.md" in (REPO / "MANIFEST.in").read_text().splitlines()  # in the sdist too


@pytest.mark.parametrize(
    "text, version",
    [
        ("# Changelog\n\n## 1.2.3 — 2027-01-31\n\n- a\n\n## 1.2.2 — 2026-12-01\n", "1.2.3"),
        ("# Changelog\n\n## Unreleased\n\n## 0.10.0rc1 — 2027-02-01\n", "0.10.0rc1"),
        ("# Changelog\n\nSee ## 9.9.9 below\n## 2.0.0 — 2027-03-01\n", "2.0.0"),
    ],
    ids=["newest-first", "unreleased-heading-skipped", "heading-at-line-start-only"],
)
def test_changelog_version_reads_the_newest_heading(text: str, version: str) -> None:
    assert changelog_version(text) == version


def test_a_changelog_without_an_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="no entry"):
        changelog_version("# Changelog\n\nnothing yet\n")
