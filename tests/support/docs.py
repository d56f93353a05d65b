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
