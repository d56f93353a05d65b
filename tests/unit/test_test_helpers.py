"""Helpers shared by test modules live in tests/conftest.py (and the conftest.py of a folder) or in
tests/support/, never in a test module: no module of the tests imports a test module
(``tests/**/test_*.py``), neither ``from tests.integration.test_console_auth import Browser`` nor
``import tests.client.test_node_clients`` nor ``from tests.browser import test_console_browser``,
nor the same written relative to its package. A helper kept in a test module is hidden from
whoever looks in tests/support/ for one, and importing it ties one test file to another's code.

Every ``.py`` file under tests/ is read (the Node.js clients' installs, ``tests/client/.node`` and
any ``node_modules``, are skipped), and parsed with ``ast`` when one of its import statements holds
``test_`` (``may_import_a_test_module``: without one, none of its imports can name a test module);
imports inside functions and under ``TYPE_CHECKING`` count too. A failure names each offending
``file:line`` and the module imported.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SKIPPED = {"node_modules", "__pycache__"}  # folders skipped wherever they are, and every hidden one:
# the clients' installs the tests make (tests/client/.node, the LlamaIndex venv in tests/client/.llama)


# An import statement: ``import …`` or ``from … import …``, up to its end (a parenthesised list, or
# the line and those its backslashes continue), at a line's start or after a semicolon.
_IMPORT_STATEMENT = re.compile(
    r"(?:^|;)[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t]*(?:\([^)]*\)|(?:\\\n|[^\n])*)", re.MULTILINE
)


def may_import_a_test_module(source: str) -> bool:
    """Whether an import statement of ``source`` holds ``test_``: any import of a test module does
    (its name, or the name it imports from its package), so a source without one imports none."""
    return any("test_" in statement.group() for statement in _IMPORT_STATEMENT.finditer(source))


def python_files(root: Path = TESTS) -> Iterator[Path]:
    """The ``.py`` files under ``root``, without the skipped folders (never walked into)."""
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        subfolders[:] = sorted(name for name in subfolders if name not in SKIPPED and not name.startswith("."))
        yield from (here / name for name in sorted(files) if name.endswith(".py"))


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package's ``__init__.py``: the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_test_module(name: str) -> bool:
    """Whether the dotted ``name`` is a test module of tests/ (``tests.<…>.test_<…>``)."""
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:])


def _is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split("."))).is_dir()


def imported_modules(source: str, importer: str, is_package: bool = False) -> list[tuple[int, str]]:
    """The modules the source of module ``importer`` imports, with their lines: ``import a.b``
    names ``a.b``; ``from a import b`` names ``a``, and ``a.b`` too when ``a`` is a folder of the
    repository (``b`` may be a module of it); relative imports are resolved against ``importer``'s
    package (``importer`` itself when ``is_package``)."""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                kept = len(package) - (node.level - 1)
                base = ".".join([*package[: max(kept, 0)], *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base:
                found.append((node.lineno, base))
            if base and _is_package(base):
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
    return sorted(found)


def offences() -> list[str]:
    """``file:line imports module`` for each import of a test module by a module of the tests."""
    found = []
    for path in python_files():
        importer = module_name(path)
        source = path.read_text(encoding="utf-8")
        if not may_import_a_test_module(source):
            continue
        for line, module in imported_modules(source, importer, path.name == "__init__.py"):
            if is_test_module(module) and module != importer:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    found = offences()
    assert not found, "move the shared helpers to tests/support/ (or a conftest.py):\n" + "\n".join(found)


def test_the_scan_sees_the_test_modules_and_skips_the_node_installs() -> None:
    scanned = {path.relative_to(ROOT).as_posix() for path in python_files()}
    assert "tests/unit/test_test_helpers.py" in scanned and "tests/support/browser.py" in scanned
    assert not [
        p for p in scanned if "node_modules" in p.split("/") or any(part.startswith(".") for part in p.split("/"))
    ]


def test_each_way_of_importing_a_test_module_is_caught() -> None:
    importer = "tests.browser.test_people_browser"
    caught = {
        "from tests.browser.test_console_browser import visit": "tests.browser.test_console_browser",
        "import tests.client.test_node_clients": "tests.client.test_node_clients",
        "import tests.client.test_node_clients as node": "tests.client.test_node_clients",
        "from tests.browser import test_console_browser": "tests.browser.test_console_browser",
        "from . import test_console_browser": "tests.browser.test_console_browser",
        "from .test_console_browser import visit": "tests.browser.test_console_browser",
        "from ..integration.test_console_auth import Browser": "tests.integration.test_console_auth",
        "def f():\n    from tests.integration.test_console_auth import Browser": "tests.integration.test_console_auth",
        "from tests.browser import (\n    visit,\n    test_console_browser,\n)": "tests.browser.test_console_browser",
        "from tests.browser import \\\n    test_console_browser": "tests.browser.test_console_browser",
        "x = 1; import tests.client.test_node_clients": "tests.client.test_node_clients",
    }
    for source, module in caught.items():
        assert may_import_a_test_module(source), source
        names = [name for _, name in imported_modules(source, importer)]
        assert module in names and is_test_module(module), (source, names)
    allowed = (
        "from tests.support.browser import visit",
        "from tests.support.console_auth import console as console",
        "from tests.integration.harness import Gateway",
        "from tests.conftest import IN_CI",
        "from tests.support import limits",
        "import pytest",
    )
    assert not may_import_a_test_module("import pytest\n\n\ndef test_x() -> None:\n    assert test_y\n")
    for source in allowed:
        names = [name for _, name in imported_modules(source, importer)]
        assert not [name for name in names if is_test_module(name)], (source, names)
