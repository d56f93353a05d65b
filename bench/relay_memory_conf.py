"""gunicorn settings for ``bench/relay_memory.py``: the gateway's own (``gunicorn.conf.py``), or
the floor's (``RELAY_BASE_CONF=floor_gunicorn``), with ``tracemalloc`` started in the worker and
a snapshot written to ``RELAY_TRACE_OUT.<n>`` at each ``SIGRTMIN+1`` the worker is sent."""

from __future__ import annotations

import importlib
import os
import signal
import tracemalloc
from typing import Any

_base = importlib.import_module(os.environ.get("RELAY_BASE_CONF", "ezat_compat.server.gunicorn_conf"))
globals().update({k: v for k, v in vars(_base).items() if not k.startswith("__")})
_taken = [0]


def post_worker_init(worker: Any) -> None:
    hook = getattr(_base, "post_worker_init", None)
    if hook is not None:
        hook(worker)
    tracemalloc.start(int(os.environ.get("RELAY_TRACE_FRAMES", "1")))

    def dump(signum: int, frame: Any) -> None:
        _taken[0] += 1
        tracemalloc.take_snapshot().dump(f"{os.environ['RELAY_TRACE_OUT']}.{_taken[0]}")

    signal.signal(signal.SIGRTMIN + 1, dump)
