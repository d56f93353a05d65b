"""Shared fixtures: free ports, service availability (PostgreSQL, Redis) with CI enforcement; how
many processes run the tests, and how many examples each hypothesis test tries (CI: its own count;
elsewhere a tenth, tests/support/property_budget.py). Helpers shared by test modules live in
tests/support/, never in a test module."""

from __future__ import annotations

import functools
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest

# The helpers that test modules share assert as the tests do: their failures show the values too.
pytest.register_assert_rewrite("tests.support")

from tests.support.heap import freeze_what_is_loaded  # noqa: E402 - after the rewrite is registered
from tests.support.property_budget import (  # noqa: E402 - after the rewrite is registered
    dev_profile_loaded,
    load_dev_profile_unless_thorough,
    scale_examples,
)

# No gateway a test starts binds the default admin listener (127.0.0.1:8081): many run at once.
os.environ.setdefault("EZAT_ADMIN_BIND", "")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
load_dev_profile_unless_thorough(IN_CI)  # before any test module: @given takes the profile loaded then
POSTGRES_URL = os.environ.get("EZAT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
# pytest-xdist's workers (gw0, gw1…) each get a database of their own (15, 14…): tests flush theirs.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS_URL = os.environ.get("EZAT_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - _WORKER % 8}")


SUITE_WORKERS = 5  # the whole suite: most of it waits on servers and subprocesses, so more than the cores
ROOT = Path(__file__).parent.parent
UNIT = ROOT / "tests" / "unit"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many processes ``-n auto`` (setup.cfg's addopts) starts: ``SUITE_WORKERS`` for the
    suite, one per core (up to that) when only ``tests/unit`` is run. Its tests are CPU-bound, and
    each process imports and collects every test module first (hypothesis, the SDKs, the app: ~3 s
    of CPU): on 2 cores, 4 processes took 25 s where 2 take 20."""
    paths = [Path(str(arg).split("::", 1)[0]).resolve() for arg in config.args]
    if paths and all(path == UNIT or UNIT in path.parents for path in paths):
        return max(1, min(SUITE_WORKERS, os.cpu_count() or 1))
    return SUITE_WORKERS


# How the suite's processes share the work (``--dist loadfile``, setup.cfg): a test file is one
# unit, run by one process, so its module-scoped servers start once; but the longest files are cut
# (``work_unit``): one whose module fixture is parametrized by database stack (its tests' first
# parameter) makes a unit of each stack, one whose tests start their own servers a unit of each
# test, so that no file sets the suite's wall clock alone.
SPLIT_BY_FIRST_PARAMETER = frozenset({"tests/integration/test_billing_limits.py"})
SPLIT_BY_TEST = frozenset({"tests/integration/test_cli.py"})


# The unit files that check translations against the SDKs' own types (they import ``anthropic``
# or ``openai``, or ``tests/support``'s modules that do): one unit, so one process imports the
# SDKs (~1.5 s of CPU each time), not every process that gets one of them.
SDK_TYPES_UNIT = "tests/unit[sdk-types]"
_SDK_MODULES = r"(?:anthropic_types|sdk_types|translation)"
_SDK_IMPORT = re.compile(
    rf"^(?:(?:from|import) (?:anthropic|openai)\b"
    rf"|from tests\.support(?:\.{_SDK_MODULES}\b| import .*\b{_SDK_MODULES}\b))",
    re.M,
)


@functools.cache
def _uses_sdk_types(path: str) -> bool:
    file = ROOT / path
    return path.startswith("tests/unit/") and file.is_file() and bool(_SDK_IMPORT.search(file.read_text("utf-8")))


def work_unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` is scheduled in: its file, a stack of it, itself, or the SDK
    types' unit."""
    path, _, rest = nodeid.partition("::")
    if _uses_sdk_types(path):
        return SDK_TYPES_UNIT
    if path in SPLIT_BY_TEST:
        return nodeid
    if path in SPLIT_BY_FIRST_PARAMETER and "[" in rest:
        return f"{path}[{rest.partition('[')[2].rstrip(']').split('-', 1)[0]}]"
    return path


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``loadfile``'s scheduling with ``work_unit`` as its units."""
    from xdist.scheduler import LoadFileScheduling

    class ByWorkUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


# The longest units of work, longest first (wall clock of a CI run: most of it waits on servers,
# timeouts and drains): handed out first, so that none starts last and sets the suite's end. A file
# not named here runs in its place after them.
LONGEST_FIRST = (
    "tests/integration/test_ops.py",
    "tests/integration/test_proxies.py",
    "tests/integration/test_store.py",
    "tests/integration/test_graceful.py",
    "tests/integration/test_bench_quick.py",
    "tests/integration/test_one_owner.py",
    "tests/integration/test_deadlines.py",
    "tests/integration/test_admin_soak.py",
    "tests/integration/test_images_gateway.py",
    "tests/integration/test_journal.py",
    "tests/integration/test_egress.py",
    "tests/browser/test_console_browser.py",
    "tests/integration/test_contained.py",
    "tests/integration/test_routing_failover.py",
    "tests/integration/test_fuzz.py",
    "tests/integration/test_rollup_store.py",
    "tests/integration/test_observability.py",
    "tests/integration/test_login_cli.py",
    "tests/integration/test_fairness.py",
    "tests/client/test_llama_index.py",
)
_RANK = {path: rank for rank, path in enumerate(LONGEST_FIRST)}


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection loaded (the package, its libraries, every test module) stays for the
    process's life: frozen out of the cyclic collector's way (tests/support/heap.py)."""
    freeze_what_is_loaded()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FIRST``; each file's tests keep their order). Outside
    CI, each hypothesis test tries a tenth of the examples its ``@settings`` names
    (``tests/support/property_budget.py``); under CI, all of them."""
    items.sort(key=lambda item: _RANK.get(item.nodeid.partition("::")[0], len(_RANK)))
    if dev_profile_loaded():
        for item in items:
            scale_examples(getattr(item, "obj", None))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip with a clear reason when a scale-out service is absent; in CI, fail instead."""
    if _reachable(host, port):
        return
    reason = f"{name} is not reachable on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{reason}, and CI=true requires it (the CI machines start it before a session)")
    pytest.skip(f"{reason}; these tests run against the real {name} of the CI machines")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    require_service("Redis", "127.0.0.1", 6379)
    return REDIS_URL
