"""The layering docs/architecture.md draws ("Layers"), held by the code: no module imports one of
a layer above its own. Imports inside functions count; those under ``TYPE_CHECKING`` don't (types
only). A module belongs to the layer of its longest matching prefix below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ezat_compat"

# Top to bottom, as docs/architecture.md lists them.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "entry points",
        (
            "ezat_compat.cli",
            "ezat_compat.people_cli",
            "ezat_compat.demo",
            "ezat_compat.login",
            "ezat_compat.__main__",
            "ezat_compat.server.gunicorn_conf",
            "ezat_compat.server.wsgi",
            "ezat_compat.server.worker",
            "ezat_compat.store.migrations",
            "ezat_compat.sim",
        ),
    ),
    ("composition root", ("ezat_compat.app",)),
    ("process", ("ezat_compat.server", "ezat_compat.config")),
    ("http", ("ezat_compat.api", "ezat_compat.admin", "ezat_compat.console")),
    ("pipeline", ("ezat_compat.pipeline", "ezat_compat.session")),
    ("dialects", ("ezat_compat.dialects", "ezat_compat.failures")),
    ("wire", ("ezat_compat.wire",)),
    (
        "edges",
        (
            "ezat_compat.upstream",
            "ezat_compat.store",
            "ezat_compat.idp",
            "ezat_compat.limits",
            "ezat_compat.cooldowns",
            "ezat_compat.sealing",
        ),
    ),
    ("translate", ("ezat_compat.translate",)),
    ("observability", ("ezat_compat.server.logs", "ezat_compat.server.metrics", "ezat_compat.server.telemetry")),
    ("foundation", ("ezat_compat",)),
)
_PACKAGES = (
    "ezat_compat",
    "ezat_compat.server",
    "ezat_compat.translate",
    "ezat_compat.store",
    "ezat_compat.wire",
    "ezat_compat.idp",
)


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of ``module``'s layer (its longest matching prefix)."""
    best, length = len(LAYERS) - 1, 0
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str) -> list[tuple[str, int]]:
    """The ``ezat_compat`` modules ``source`` imports, with their lines (``from pkg import mod``
    names the module when ``pkg`` is one of the package's folders)."""
    found: list[tuple[str, int]] = []

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            module = node.module or ""
            if node.level or not module.startswith("ezat_compat"):
                return
            if module in _PACKAGES:
                found.extend((f"{module}.{alias.name}", node.lineno) for alias in node.names)
            else:
                found.append((module, node.lineno))

        def visit_Import(self, node: ast.Import) -> None:
            found.extend((a.name, node.lineno) for a in node.names if a.name.startswith("ezat_compat"))

    Visitor().visit(ast.parse(source))
    return found


def violations(module: str, source: str) -> list[str]:
    own = layer_of(module)
    return [
        f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer_of(target)][0]}), line {line}"
        for target, line in imports_of(source)
        if layer_of(target) < own
    ]


def test_no_module_imports_one_of_a_layer_above_its_own() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += violations(_module_name(path), path.read_text(encoding="utf-8"))
    assert not found, "imports against the layering of docs/architecture.md:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("ezat_compat.store.hotpath", "from ezat_compat.server.procid import pid", True),
        ("ezat_compat.store.hotpath", "from ezat_compat.procid import pid", False),
        ("ezat_compat.translate.request", "from ezat_compat.wire.json import no_pause", True),
        ("ezat_compat.wire.openai", "from ezat_compat.translate.tables import REASONING_EFFORTS", False),
        ("ezat_compat.server.serving", "def f():\n    from ezat_compat.app import create_app", True),
        ("ezat_compat.domain", "from ezat_compat.config import load_config", True),
        ("ezat_compat.pipeline", "from ezat_compat.server.metrics import Metrics", False),
        ("ezat_compat.store.ledger", "if TYPE_CHECKING:\n    from ezat_compat.pipeline import Call", False),
    ],
    ids=[
        "store-to-server",
        "store-to-foundation",
        "translate-to-wire",
        "wire-to-translate",
        "serving-to-app",
        "domain-to-config",
        "pipeline-to-observability",
        "types-only",
    ],
)
def test_the_check_tells_an_import_against_the_layering(module: str, source: str, broken: bool) -> None:
    assert bool(violations(module, source)) is broken
