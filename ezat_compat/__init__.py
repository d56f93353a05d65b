"""ezat_compat: an on-prem gateway serving OpenAI Chat Completions and Anthropic Messages
in front of Claude deployments.

``__version__`` has one source: the newest entry of ``CHANGELOG.md`` at the repository's root.
From a checkout (an editable install included) it is read from that file, so a new entry shows at
once; setup.cfg takes the package's version from ``__version__`` when it is built, and an installed
package, which has no changelog beside it, reports that version from its metadata.
"""

from __future__ import annotations

import re
from pathlib import Path

_NEWEST = re.compile(r"^## +(\d+\.\d+\.\d+\S*)", re.MULTILINE)


def changelog_version(text: str) -> str:
    """The version the newest entry of a changelog names (its first ``## X.Y.Z …`` heading);
    ``ValueError`` when there is none."""
    found = _NEWEST.search(text)
    if found is None:
        raise ValueError("CHANGELOG.md has no entry: add '## X.Y.Z — YYYY-MM-DD' on top")
    return found.group(1)


def _version() -> str:
    checkout = Path(__file__).resolve().parent.parent
    changelog = checkout / "CHANGELOG.md"
    if changelog.is_file() and (checkout / "setup.cfg").is_file():
        return changelog_version(changelog.read_text(encoding="utf-8"))
    from importlib.metadata import version

    return version("ezat-compat")


__version__ = _version()
