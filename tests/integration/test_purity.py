"""The pure core imports nothing impure, directly or through another module (the rule of
ezat_compat/translate/README.md): no framework, no TOML or schema library, no database or HTTP client, no
gevent, no clock, ids or randomness.

Each pure module is imported in a fresh interpreter after the forbidden modules have been
taken out of ``sys.modules`` (some, such as ``os`` and ``time``, are loaded at start-up); any
of them found there afterwards was imported on the way, however indirectly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).resolve().parents[2] / "ezat_compat"
PURE = [
    *(f"ezat_compat.translate.{p.stem}" for p in sorted((PACKAGE / "translate").glob("*.py"))),
    "ezat_compat.domain",
    "ezat_compat.routing",
    "ezat_compat.pricing",
    "ezat_compat.catalog",
    "ezat_compat.wire.paths",
]
FORBIDDEN = (
    "flask",
    "werkzeug",
    "marshmallow",
    "tomllib",
    "sqlalchemy",
    "requests",
    "urllib3",
    "gevent",
    "redis",
    "time",
    "uuid",
    "random",
    "socket",
    "threading",
    "datetime",
    "secrets",
    "sqlite3",
)

PROBE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[2])  # this checkout's package, not an installed copy (-I ignores the cwd)
forbidden = set(sys.argv[3:])
for name in list(sys.modules):
    if name.split(".")[0] in forbidden:
        del sys.modules[name]
importlib.import_module(sys.argv[1])
print(json.dumps(sorted({n.split(".")[0] for n in sys.modules} & forbidden)))
"""


def imported_forbidden(module: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, module, str(PACKAGE.parent), *FORBIDDEN],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_nothing_impure(module: str) -> None:
    assert imported_forbidden(module) == [], f"{module} pulls in impure modules"


def test_the_probe_sees_an_indirect_import() -> None:
    """The probe itself can fail: a module that imports the clock through another is caught."""
    assert "time" in imported_forbidden("ezat_compat.upstream.client")
    assert "tomllib" in imported_forbidden("ezat_compat.config")
