"""A worker sets its loaded app aside from the cyclic collector (``serving.tune_collector``), in a
process of its own. That a request leaves no reference cycle for the collector to find is tested
in tests/unit/test_no_cycles.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_worker_sets_its_loaded_app_aside_from_the_collector() -> None:
    """``serving.tune_collector`` (gunicorn's post_worker_init): what exists then is frozen,
    the first generation is ``YOUNG_GENERATION``; run in a process of its own."""
    script = (
        "import gc, json, flask, sqlalchemy\n"
        "from ezat_compat.server import serving\n"
        "before = gc.get_freeze_count()\n"
        "serving.tune_collector()\n"
        "print(json.dumps([before, gc.get_freeze_count(), list(gc.get_threshold()), serving.YOUNG_GENERATION]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    before, frozen, threshold, young = json.loads(done.stdout)
    assert before == 0 and frozen > 10_000  # the loaded modules' objects
    assert threshold == [young, 10, 10] and young == 10_000
