"""This process's id, read once and again in a forked child.

``os.getpid()`` is a system call (glibc stopped caching it), and the hot path asks for it
about sixteen times a request: every Prometheus sample written to the multiprocess files
checks it, and so do the per-process SQLite connections and upstream pools, which must not be
used across gunicorn's fork. ``pid()`` answers from memory; ``os.register_at_fork`` refreshes
it in the child before any code of the child runs.
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def pid() -> int:
    """``os.getpid()``, without the system call."""
    return _pid
