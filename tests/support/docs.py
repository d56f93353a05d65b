"""Code blocks of the project's documentation, as printed there: the tests that run an example
take it from the page a user copies it from."""

from __future__ import annotations

import re
from pathlib import Path


def code_block(page: Path, language: str, containing: str) -> str:
    """The one ``language`` fenced block of ``page`` that contains ``containing``."""
    blocks = re.findall(rf"```{re.escape(language)}\n(.*?)```", page.read_text(), re.DOTALL)
    (found,) = [block for block in blocks if containing in block]
    return found


CLIENTS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
# The gateway's address and key as docs/clients.md's examples print them: a test puts its own in.
EXAMPLE_BASE = "http://127.0.0.1:8080"
EXAMPLE_KEY = "ezat_sk_…"


def clients_example(marker: str) -> str:
    """docs/clients.md's Python code block that contains ``marker``, as printed there."""
    return code_block(CLIENTS_PAGE, "python", marker)
