"""The walk of one request (``bench/walk.py``): the app as ``create_app`` builds it, one chat
completion traced with ``sys.setprofile``. No module is re-entered for one step (called back
while it is still on the stack: a callback, a hook or a lambda of a module run by another), and
the usage of a JSON answer is parsed once."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.integration.harness import REPO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def walk() -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import walk as module
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_no_module_is_re_entered_for_one_step(walk: Any, stream: bool) -> None:
    figures = walk.walk(stream)
    assert figures["re_entered_for_one_step"] == 0, figures["call_backs"]
    if not stream:
        assert figures["usage_parses"] == 1, figures


def test_a_call_back_is_seen_and_named(walk: Any) -> None:
    """The tracer itself: a module that calls back into its caller is counted, chain named."""
    tracer = walk.Walk()
    tracer.stack = ["ezat_compat.pipeline", "ezat_compat.dialects", "ezat_compat.dialects"]
    # A frame of ezat_compat.pipeline entered from dialects: a call back.
    code = compile("def resolve():\n    return sys._getframe()\n", "pipeline", "exec")
    namespace: dict[str, Any] = {"__name__": "ezat_compat.pipeline", "sys": sys}
    exec(code, namespace)
    tracer(namespace["resolve"](), "call", None)
    figures = tracer.figures()
    assert figures["re_entered_for_one_step"] == 1
    assert figures["call_backs"] == {"pipeline > dialects > pipeline:resolve": 1}
