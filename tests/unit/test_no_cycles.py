"""A request leaves no reference cycle behind: everything it made is freed by reference counting
the moment it ends. A cycle per request (a parsed request holding a step bound to itself, a
stream and its owner holding each other) keeps all its objects — the parsed body, the
translation, the WSGI environ — until the cyclic collector runs, and under load that collector
then runs several times as often and scans the whole heap: tens of µs a request (bench/RESULTS.md).
Each dialect, JSON and stream, through the pipeline with fakes; ``gc.collect()`` counts what it
found unreachable."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest

from ezat_compat.api.sse import relay
from ezat_compat.pipeline import ClientRequest, Reply
from ezat_compat.session import StreamSession
from tests.support.heap import freeze_what_is_loaded
from tests.support.pipeline import ANTHROPIC, END, MESSAGE, OPENAI, RESPONSES, START, TEXT, events, gateway

BODIES = {
    "chat": (OPENAI, {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
    "messages": (ANTHROPIC, {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": (RESPONSES, {"model": "m", "max_output_tokens": 64, "instructions": "terse", "input": "hi"}),
}


@pytest.fixture(scope="module")
def heap_frozen() -> Iterator[None]:
    """What the process held before these tests (modules, the app, other tests' objects), frozen
    as the server freezes the loaded app before its first request (``server/serving.py``):
    ``gc.collect()`` then scans what the requests made, not a heap of every test module. It stays
    frozen after them, as what the process loaded is (tests/support/heap.py)."""
    gc.collect()
    freeze_what_is_loaded()
    yield


@pytest.fixture
def collector_off(heap_frozen: None) -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def serve(dialect: Any, body: dict[str, Any], stream: bool, rid: str) -> None:
    script: Any = events(START, *TEXT, *END) if stream else MESSAGE
    gw, _, _ = gateway({"a": script, "b": script, "c": script})
    raw = json.dumps({**body, "stream": stream}).encode()
    out = gw.handle(dialect, ClientRequest(request_id=rid, api_key="k", headers={}, read_body=lambda: raw))
    if stream:
        assert isinstance(out, StreamSession)
        chunks = list(relay(out))
        out.close()
        assert chunks
    else:
        assert isinstance(out, Reply) and out.body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", list(BODIES))
def test_a_request_leaves_nothing_for_the_cyclic_collector(name: str, stream: bool, collector_off: None) -> None:
    dialect, body = BODIES[name]
    serve(dialect, body, stream, "r0")  # first use: caches and lazily built state
    gc.collect()
    for i in range(1, 4):
        serve(dialect, body, stream, f"r{i}")
    assert gc.collect() == 0
