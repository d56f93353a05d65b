"""The drain flag, for the shutdown code: ``start_draining()`` makes ``GET /readyz`` answer
503 (``"draining": true``) from that moment on, while every other route keeps serving, so a
load balancer stops sending before the listener closes.

Called in a worker, it covers that worker; called in the gunicorn master, it covers every
worker through the marker file named by ``EZAT_DRAIN_FILE`` (the gateway's gunicorn settings
set it, per master; a worker checks it with one ``stat`` per probe). ``stop_draining()``
undoes both. Standard library only: the gunicorn master imports it before the workers'
gevent patching.
"""

from __future__ import annotations

import contextlib
import os
import threading

DRAIN_FILE_ENV = "EZAT_DRAIN_FILE"

_draining = threading.Event()


def start_draining() -> None:
    """From now on ``/readyz`` answers 503 (``"draining": true``); the other routes keep
    serving. In the gunicorn master, every worker sees it (``EZAT_DRAIN_FILE``)."""
    _draining.set()
    path = os.environ.get(DRAIN_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a"):
            pass


def stop_draining() -> None:
    """Ready again (an aborted drain, tests)."""
    _draining.clear()
    path = os.environ.get(DRAIN_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


def draining() -> bool:
    if _draining.is_set():
        return True
    path = os.environ.get(DRAIN_FILE_ENV)
    return path is not None and path != "" and os.path.exists(path)
