"""This process's id, read once and again in a forked child.

``os.getpid()`` is a system call (glibc stopped caching it), and the hot path asks for it
about sixteen times a request: every Prometheus sample written to the multiprocess files
checks it, and so do the per-process SQLite connections and upstream pools, which must not be
used across gunicorn's fork. ``pid()`` answers from memory; ``os.register_at_fork`` refreshes
it in the child before any code of the child runs.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def pid() -> int:
    """``os.getpid()``, without the system call."""
    return _pid


def after_fork(owner: T, forked: Callable[[T], None]) -> None:
    """Run ``forked(owner)`` in every forked child, before any code of the child runs, for as long
    as ``owner`` lives (it is held weakly): per-process state (a connection, a queue, a lock) is
    reset once at the fork instead of the process id being compared on every use."""
    ref = weakref.ref(owner)

    def in_child() -> None:
        alive = ref()
        if alive is not None:
            forked(alive)

    os.register_at_fork(after_in_child=in_child)
