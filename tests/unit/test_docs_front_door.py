"""The README is the front door and the pages of ``docs/`` hold the rest, configuration once.

- The README is at most 15 KB and starts with exactly two commands: the first installs the
  gateway and runs ``ezat-compat demo``; the second is the command CI runs (the last line of
  ``.ci/run``), character for character.
- Every relative link of the README and of ``docs/`` reaches a file that exists and, with a
  ``#fragment``, a heading of that page (GitHub's anchors), so nothing moved leaves a dead link.
- The configuration is shown in one place: no page but ``docs/config.md`` (and the example file
  it names) carries a TOML block of the gateway's own tables.
- What ``docs/config.md`` says about token counting per provider is what ``endpoints.offers``
  does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ezat_compat.domain import PROVIDERS
from ezat_compat.endpoints import COUNT_TOKENS, MESSAGES, offers

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_BYTES = 15 * 1024

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_OUR_TABLES = re.compile(r"^\[\[?(gateway|server|responses|logging|models)[\].]", re.MULTILINE)


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (their ``#`` lines are no headings)."""
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces made ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            anchor = _anchor(match.group(1))
            suffix = 0
            while (f"{anchor}-{suffix}" if suffix else anchor) in found:
                suffix += 1
            found.add(f"{anchor}-{suffix}" if suffix else anchor)
    return found


# ---------------------------------------------------------------- the README


def test_the_readme_is_at_most_15_kb() -> None:
    assert len(README.read_bytes()) <= README_MAX_BYTES


def _readme_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    match = re.match(r"# ezat-compat\n\n```bash\n(.*?)\n```\n", text, re.DOTALL)
    assert match, "the README starts with its title, then a bash block of the two commands"
    return match.group(1).splitlines()


def test_the_readme_starts_with_the_demo_and_the_tests() -> None:
    demo, tests = _readme_commands()
    assert demo == "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/ezat-compat demo"
    ci_runs = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert tests == ci_runs


def test_the_readme_points_at_every_page_of_docs() -> None:
    linked = set(_LINK.findall(_prose(README)))
    for page in sorted(DOCS.glob("*.md")):
        assert any(link.split("#")[0] == f"docs/{page.name}" for link in linked), f"README: no link to {page.name}"


# ---------------------------------------------------------------- links


def _relative_links() -> list[tuple[Path, str]]:
    return [
        (page, link)
        for page in PAGES
        for link in _LINK.findall(_prose(page))
        if not re.match(r"[a-z]+:", link)  # http:, https:, mailto:
    ]


def test_the_pages_link_to_each_other() -> None:
    assert len(_relative_links()) > 40


@pytest.mark.parametrize(
    ("page", "link"), _relative_links(), ids=[f"{p.name}->{link}" for p, link in _relative_links()]
)
def test_a_relative_link_reaches_its_file_and_heading(page: Path, link: str) -> None:
    path, _, fragment = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    assert target.exists(), f"{page.name}: {link} names no file"
    if fragment:
        assert target.suffix == ".md", f"{page.name}: {link}: a fragment of a page that isn't Markdown"
        assert fragment in _anchors(target), f"{page.name}: {link}: {target.name} has no such heading"


def test_the_anchor_rule_is_githubs() -> None:
    assert _anchor("`[[models]]`") == "models"
    assert _anchor("`[models.price]` and `[models.deployments.price]`") == "modelsprice-and-modelsdeploymentsprice"
    assert _anchor("Egress: proxies, CAs and client certificates") == "egress-proxies-cas-and-client-certificates"
    assert _anchor("Reloads, start-up, the database and upgrades") == "reloads-start-up-the-database-and-upgrades"


# ---------------------------------------------------------------- configuration, once


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "config.md"], ids=lambda p: p.name)
def test_no_page_but_the_reference_shows_the_configuration_file(page: Path) -> None:
    for block in re.findall(r"```toml\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL):
        assert not _OUR_TABLES.search(block), f"{page.name}: a TOML block of the gateway's tables; link docs/config.md"


def test_the_reference_says_what_the_code_does_about_token_counting() -> None:
    """``docs/config.md``, "Providers": every provider serves ``/v1/messages/count_tokens``."""
    assert all(offers(provider, MESSAGES) for provider in PROVIDERS)
    assert all(offers(provider, COUNT_TOKENS) for provider in PROVIDERS), "update docs/config.md, 'Token counting'"
    text = re.sub(r"\s+", " ", (DOCS / "config.md").read_text(encoding="utf-8"))
    assert "`/v1/messages/count_tokens` is offered by every provider" in text
    assert "not offered" not in text
