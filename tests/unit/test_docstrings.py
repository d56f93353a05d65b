"""Docstrings and comments cite rules a newcomer can follow.

A rule is named by the reference page and section it comes from (``Chat Completions reference,
"Streaming"``; ``API reference, "Response Body"``) or simply stated. Nothing in the source points
at a tracker's issue number or at a file outside the repository (the reference pages' own file
names, the design and style notes, a sibling folder): a newcomer has only the repository.

Every ``.py`` and ``.md`` file of the package, the tests, the benchmark and the documentation
(``docs/``), and the README, is scanned line by line; a failure names each offending ``file:line``.
"""

from __future__ import annotations

import bisect
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("ezat_compat", "tests", "bench", "docs")
TOP_LEVEL = ("README.md",)

# Each pattern is written so that this file doesn't match it (character classes and escapes), for
# lowercased text, and starts with a literal: a word boundary before it is a lookbehind after its
# first character (``i(?<!\wi)ssue`` is ``\bissue``), so that ``re`` skips ahead to the literal.
FORBIDDEN = {
    "an issue number": re.compile(r"i(?<!\wi)ssues?(?:[ -]#?[0-9]|:)|#(?<![\w/]#)[0-9]+\b(?![\w/])"),
    "a reference page's file name": re.compile(r"chat-completions[.]md|api-[r]eference(?:[.]txt)?\b"),
    "a note outside the repository": re.compile(r"d(?<!\wd)esign[.]md\b|s(?<!\ws)tyle[.]md\b"),
    "a sibling folder": re.compile(r"[.][.]/+shared\b|s(?<!\ws)hared[/]+spec\b|s(?<![\w/.-]s)pe[c]/"),
}


def offences(text: str) -> list[tuple[int, str, str]]:
    """(line number, what it points at, the line) for each line that breaks the rule, in the
    order of the lines, then of ``FORBIDDEN``. Each pattern runs once over the whole text,
    lowercased (a line at a time, or ignoring case, is ten times the work); none spans two lines."""
    lowered = text.lower()  # as many lines as the text (lowercase letters may be longer: counted apart)
    starts = list(itertools.accumulate(map(len, lowered.splitlines(keepends=True)), initial=0))
    hits = {
        (bisect.bisect_right(starts, match.start()), order)
        for order, pattern in enumerate(FORBIDDEN.values())
        for match in pattern.finditer(lowered)
    }
    whats, lines = list(FORBIDDEN), text.splitlines()
    return [(number, whats[order], lines[number - 1].strip()) for number, order in sorted(hits)]


def _foreign(parts: tuple[str, ...]) -> bool:
    """Installed or generated folders (a venv, node_modules, caches): not the project's text."""
    return any(part.startswith(".") or part in {"build", "node_modules", "__pycache__"} for part in parts)


def sources() -> list[Path]:
    files = [ROOT / name for name in TOP_LEVEL]
    for folder in SCANNED:
        for suffix in ("*.py", "*.md"):
            files.extend(p for p in (ROOT / folder).rglob(suffix) if not _foreign(p.relative_to(ROOT).parts))
    return sorted(files)


def test_the_scan_covers_the_package_the_tests_the_benchmark_and_the_docs() -> None:
    scanned = {p.relative_to(ROOT).as_posix() for p in sources()}
    for expected in (
        "README.md",
        "ezat_compat/pipeline.py",
        "ezat_compat/translate/README.md",
        "bench/report.py",
        "docs/config.md",
        "docs/operations.md",
    ):
        assert expected in scanned
    assert "tests/unit/test_docstrings.py" in scanned
    assert len(scanned) > 50


@pytest.mark.parametrize(
    ("line", "what"),
    [
        # pointers a newcomer can't follow
        ("cooldown; a single probe decides (iss" + "ue 6).", "an issue number"),
        ("(Iss" + "ue 5 through the real gateway)", "an issue number"),
        ("Per-key limits (iss" + "ues 6 and 7).", "an issue number"),
        ("reserves the worst case (iss" + "ue: nothing overdrawn).", "an issue number"),
        ("## The iss" + "ue-8 run", "an issue number"),
        ("fixed in #" + "42", "an issue number"),
        ("Spec: chat-completions." + 'md "Streaming"', "a reference page's file name"),
        ("api-refer" + 'ence.txt "Response Body"', "a reference page's file name"),
        ("(api-refer" + 'ence: "ModelName")', "a reference page's file name"),
        ("(design." + 'md, "Operator interface")', "a note outside the repository"),
        ("style." + "md habit 8", "a note outside the repository"),
        ("one row per rule of `../shar" + "ed/spec/x`", "a sibling folder"),
        ("the pages in spe" + "c/ say so", "a sibling folder"),
    ],
)
def test_a_pointer_outside_the_repository_is_caught(line: str, what: str) -> None:
    assert [w for _, w, _ in offences(line)] == [what]


@pytest.mark.parametrize(
    "line",
    [
        'Chat Completions reference, "Streaming"',
        'API reference, "Response Body"',
        'the operator interface (README, "Running it in production")',
        "issued += 1",
        ".issuer_name(ca_name)",
        'Rule("image_bytes", _ISSUE + "anthropics/claude-code/issues/8227", _image_bytes),',
        "see ezat_compat/translate/README.md and bench/RESULTS.md",
        "tests/client/examples/README.md",
        "color: #fff; 3 # comment",
    ],
)
def test_a_rule_named_in_the_repository_passes(line: str) -> None:
    assert offences(line) == []


def test_no_docstring_or_comment_points_at_an_issue_or_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {what}: {line}"
        for path in sources()
        for number, what, line in offences(path.read_text(encoding="utf-8"))
    ]
    assert not found, "name the reference page and section, or state the rule:\n" + "\n".join(found)
