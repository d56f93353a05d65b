"""The pure core imports no I/O, framework, clock or randomness (translate/README.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ezat_compat"
PURE = [
    *sorted((PACKAGE / "translate").glob("*.py")),
    PACKAGE / "routing.py",
    PACKAGE / "pricing.py",
    PACKAGE / "catalog.py",
    PACKAGE / "wire" / "paths.py",
]
FORBIDDEN = {
    "flask",
    "werkzeug",
    "requests",
    "urllib3",
    "sqlalchemy",
    "gevent",
    "redis",
    "time",
    "uuid",
    "random",
    "socket",
    "os",
    "threading",
    "datetime",
    "secrets",
}


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_modules_import_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path.name} imports {sorted(imported & FORBIDDEN)}"
