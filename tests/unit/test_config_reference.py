"""docs/config.md and deploy/ezat.example.toml stay true to the loader (``ezat_compat/config.py``).

The loader's tables and keys are read from its marshmallow schemas through marshmallow's public
API (``Schema.fields``, ``Nested.schema``, ``List.inner``, ``Field.load_default``), walked from the
root schema, so a table or key added to the loader is checked without touching this file:

- every key of every table is in docs/config.md's table for that section and in the example
  (written out or commented out), and neither names a key or a section the loader doesn't know;
- the example loads with the real loader, reaches each provider, and every value it shows for
  the global tables, the first model and that model's first deployment is the loader's default;
  so is every default docs/config.md writes as a TOML value;
- every environment variable docs/config.md names is read in ``ezat_compat/``, and each
  ``EZAT_*`` variable the package reads is named there.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from marshmallow import Schema, fields, missing

from ezat_compat.config import _ConfigSchema, load_config
from ezat_compat.domain import PROVIDERS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"
EXAMPLE = ROOT / "deploy" / "ezat.example.toml"
PACKAGE = ROOT / "ezat_compat"

# Values the example and the reference show instead of the loader's default, and why.
EXAMPLE_NOT_DEFAULT = {
    ("models.deployments", "base_url"): 'an anthropic deployment needs one: "" means the provider\'s endpoint',
}
DOC_PROSE_DEFAULT = {
    ("models.deployments", "base_url"): '"" stands for the provider\'s endpoint, which the reference names in words',
}


# ---------------------------------------------------------------- the loader


def _table_schema(field: fields.Field) -> Schema | None:
    """The schema of a table (``Nested``) or of an array of tables (``List`` of ``Nested``)."""
    if isinstance(field, fields.List):
        field = field.inner
    return field.schema if isinstance(field, fields.Nested) else None


@cache
def loader_sections() -> dict[str, dict[str, fields.Field]]:
    """Each table of the file by its TOML path ("gateway", "models.deployments.price") -> its keys."""
    found: dict[str, dict[str, fields.Field]] = {}

    def walk(schema: Schema, path: str) -> None:
        for name, field in schema.fields.items():
            table = _table_schema(field)
            if table is not None:
                here = f"{path}.{name}" if path else name
                found[here] = dict(table.fields)
                walk(table, here)

    walk(_ConfigSchema(), "")
    return found


def plain_default(field: fields.Field) -> Any:
    """The field's default when it is a value a file can write; ``missing`` otherwise (required,
    ``None``: computed or taken from elsewhere, or a callable: a table's defaults)."""
    default = field.load_default
    if default is missing or default is None or callable(default):
        return missing
    return default


def same(value: Any, default: Any) -> bool:
    """``value`` (from TOML) is ``default`` (the loader's), type included: TOML's integer for an
    integer, a number for a float or a decimal."""
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, Decimal):
        return isinstance(value, int | float) and Decimal(str(value)) == default
    if isinstance(default, float):
        return isinstance(value, int | float) and float(value) == default
    return type(value) is type(default) and value == default


def test_the_walk_finds_every_table_of_the_loader() -> None:
    assert set(loader_sections()) == {
        "admin",
        "alerts",
        "identity",
        "console",
        "telemetry",
        "spend",
        "gateway",
        "server",
        "responses",
        "logging",
        "models",
        "models.price",
        "models.deployments",
        "models.deployments.price",
    }
    assert "cooldown_s" in loader_sections()["gateway"] and "client_key" in loader_sections()["models.deployments"]


# ---------------------------------------------------------------- docs/config.md


@cache
def doc_rows() -> dict[str, dict[str, list[str]]]:
    """section -> key -> the cells of its row, from the tables under each heading that names
    sections in backticks (``## `[gateway]` ``, ``## `[models.price]` and `[models.deployments.price]` ``)."""
    rows: dict[str, dict[str, list[str]]] = {}
    current: list[str] = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            current = re.findall(r"`\[\[?([a-z_.]+)\]\]?`", line)
            for section in current:
                rows.setdefault(section, {})
            continue
        match = re.match(r"\| `([a-z_]+)` \|", line)
        if current and match:
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            for section in current:
                rows[section][match.group(1)] = cells
    return rows


def test_the_reference_documents_every_key_of_every_table_and_no_other() -> None:
    documented = doc_rows()
    assert set(documented) == set(loader_sections()), "docs/config.md: sections unlike the loader's tables"
    problems = []
    for section, keys in loader_sections().items():
        missing_keys = sorted(set(keys) - set(documented[section]))
        stale = sorted(set(documented[section]) - set(keys))
        if missing_keys:
            problems.append(f"[{section}] not documented: {', '.join(missing_keys)}")
        if stale:
            problems.append(f"[{section}] documented but unknown to the loader: {', '.join(stale)}")
    assert not problems, "docs/config.md:\n" + "\n".join(problems)


def test_the_reference_rows_have_a_type_a_default_and_a_meaning() -> None:
    for section, keys in doc_rows().items():
        for key, cells in keys.items():
            assert len(cells) == 4 and all(cells), f"docs/config.md [{section}] {key}: key | type | default | meaning"


def _toml_value(text: str) -> Any:
    """A default cell written as one TOML value in backticks; ``missing`` for words."""
    match = re.fullmatch(r"`([^`]+)`", text)
    if match is None:
        return missing
    try:
        return tomllib.loads(f"v = {match.group(1)}")["v"]
    except tomllib.TOMLDecodeError:
        return missing


def test_the_reference_defaults_are_the_loaders() -> None:
    problems = []
    for section, keys in doc_rows().items():
        for key, cells in keys.items():
            field = loader_sections().get(section, {}).get(key)
            if field is None:
                continue  # unknown to the loader: the test above names it
            default = plain_default(field)
            written = _toml_value(cells[2])
            if written is missing:
                if default is not missing and (section, key) not in DOC_PROSE_DEFAULT:
                    problems.append(f"[{section}] {key}: the default is {default!r}, written as {cells[2]!r}")
            elif default is missing or not same(written, default):
                shown = "none" if default is missing else repr(default)
                problems.append(f"[{section}] {key}: documented {cells[2]}, the loader's default is {shown}")
    assert not problems, "docs/config.md:\n" + "\n".join(problems)


# ---------------------------------------------------------------- deploy/ezat.example.toml


@dataclass(frozen=True)
class Shown:
    """A key the example shows: written out (``live``) or commented out."""

    section: str
    key: str
    first: bool  # in the first entry of every array of tables it is in (the entries showing defaults)
    live: bool
    line: str  # the assignment, without the comment sign


_HEADER = re.compile(r"(\[\[?)([a-z_.]+)\]\]?\s*(#.*)?")
_ASSIGNMENT = re.compile(r"([a-z_]+) = \S")


def example_lines() -> Iterator[Shown]:
    """Each assignment of the example, live or commented out (``# key = value``), in the table it
    is under, and each table header as a key of its parent (``[models.price]``: ``price`` of
    ``models``); a commented-out header (``# [models.deployments.price]``) opens a table too."""
    section, indices = "", {}
    for raw in EXAMPLE.read_text(encoding="utf-8").splitlines():
        live = not raw.startswith("#")
        text = raw.strip() if live else raw[1:].strip()
        header = _HEADER.fullmatch(text)
        if header:
            section = header.group(2)
            if header.group(1) == "[[":
                indices[section] = indices.get(section, -1) + 1
                for deeper in [s for s in indices if s.startswith(section + ".")]:
                    del indices[deeper]
            parent, _, key = section.rpartition(".")
            if parent:  # [models.price] is the key price of [[models]]
                yield Shown(parent, key, all(index == 0 for index in indices.values()), live, text)
            continue
        assignment = _ASSIGNMENT.match(text)
        if assignment:
            first = all(index == 0 for index in indices.values())
            yield Shown(section, assignment.group(1), first, live, text)


def test_the_example_shows_every_key_of_every_table_and_no_other() -> None:
    shown: dict[str, set[str]] = {}
    for item in example_lines():
        shown.setdefault(item.section, set()).add(item.key)
    assert set(shown) == set(loader_sections()), "deploy/ezat.example.toml: tables unlike the loader's"
    problems = []
    for section, keys in loader_sections().items():
        missing_keys = sorted(set(keys) - shown[section])
        stale = sorted(shown[section] - set(keys))
        if missing_keys:
            problems.append(f"[{section}] not shown: {', '.join(missing_keys)}")
        if stale:
            problems.append(f"[{section}] shown but unknown to the loader: {', '.join(stale)}")
    assert not problems, "deploy/ezat.example.toml:\n" + "\n".join(problems)


def test_the_example_loads_as_it_is_with_every_provider(tmp_path: Path) -> None:
    config = load_config(EXAMPLE, environ={})  # no key variable set: those deployments load, unkeyed
    deployments = [d for model in config.models for d in model.deployments]
    assert {d.provider for d in deployments} == set(PROVIDERS)
    assert all(not d.api_key for d in deployments)
    keyed = load_config(EXAMPLE, environ={"ANTHROPIC_API_KEY": "sk-test"})
    assert keyed.models[0].deployments[0].api_key == "sk-test"
    copy = tmp_path / "ezat.toml"  # relative paths resolve beside the file, wherever it is
    copy.write_bytes(EXAMPLE.read_bytes())
    assert load_config(copy, environ={}).gateway.database_url == f"sqlite:///{tmp_path / 'ezat.db'}"


def _live_value(data: dict[str, Any], section: str, key: str) -> Any:
    """``key`` of ``section`` in the parsed file, in the first entry of each array of tables."""
    node: Any = data
    for part in section.split("."):
        node = node[part]
        if isinstance(node, list):
            node = node[0]
    return node[key]


def test_the_example_shows_the_loaders_defaults() -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    problems = []
    checked = 0
    for item in example_lines():
        if not item.first or (item.section, item.key) in EXAMPLE_NOT_DEFAULT:
            continue
        field = loader_sections().get(item.section, {}).get(item.key)
        if field is None:
            continue  # unknown to the loader: the test above names it
        default = plain_default(field)
        if default is missing:
            continue
        value = _live_value(data, item.section, item.key) if item.live else tomllib.loads(item.line)[item.key]
        checked += 1
        if not same(value, default):
            problems.append(f"[{item.section}] {item.key} = {value!r}, the loader's default is {default!r}")
    assert not problems, "deploy/ezat.example.toml:\n" + "\n".join(problems)
    assert checked > 60  # every key of the global tables and of the first model and deployment


def test_the_example_writes_out_every_default_outside_the_deployments() -> None:
    """A reader can copy any line of the global tables and the first model as it is: every key
    with a default is written out there (the deployments show provider-specific keys commented)."""
    live = {(i.section, i.key) for i in example_lines() if i.live and i.first}
    for section in ("gateway", "server", "responses", "logging", "models"):
        for key, field in loader_sections()[section].items():
            if plain_default(field) is not missing:
                assert (section, key) in live, f"deploy/ezat.example.toml: [{section}] {key} is not written out"


# ---------------------------------------------------------------- environment variables


def _package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@cache
def package_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in _package_sources())


@cache
def package_strings() -> frozenset[str]:
    """The string literals of the package's code (docstrings left out) in the modules whose text
    names ``EZAT`` (only they can hold one of our variables' names: the others aren't parsed)."""
    found: set[str] = set()
    for path in _package_sources():
        source = path.read_text(encoding="utf-8")
        if "EZAT" not in source:
            continue
        tree = ast.parse(source)
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found.add(node.value)
    return frozenset(found)


def documented_variables() -> set[str]:
    return set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", DOC.read_text(encoding="utf-8")))


def test_the_reference_names_environment_variables() -> None:
    names = documented_variables()
    assert {"EZAT_CONFIG", "EZAT_DATA_DIR", "EZAT_SEALING_KEY", "HTTPS_PROXY", "REQUESTS_CA_BUNDLE"} <= names


@pytest.mark.parametrize("name", sorted(documented_variables()))
def test_each_documented_variable_is_read_by_the_package(name: str) -> None:
    """Ours (``EZAT_*``) are read by name in the code; the others are read by the libraries the
    code hands them to (requests, google-auth) or are key variables, and the code names them."""
    if name.startswith("EZAT_"):
        assert name in package_strings(), f"docs/config.md names {name}, which no code in ezat_compat/ reads"
    else:
        assert re.search(rf"\b{name}\b", package_text()), f"docs/config.md names {name}, unknown to ezat_compat/"


def test_every_variable_of_ours_the_package_reads_is_documented() -> None:
    ours = {s for s in package_strings() if re.fullmatch(r"EZAT_[A-Z0-9_]+", s)}
    assert "EZAT_SEALING_KEY" in ours
    undocumented = sorted(ours - documented_variables())
    assert not undocumented, f"docs/config.md: environment variables read but not named: {', '.join(undocumented)}"
