"""A lock of the operating-system thread, also in a gevent worker.

gevent's patching makes ``threading.Lock`` a cooperative lock written in Python (Cython),
which costs several times a plain lock's acquire and release; the hot path takes about twenty
a request (the metrics' multiprocess values, the store's group commit and its connection).
Those sections never yield to another greenlet while they hold the lock (pure computation,
``sqlite3`` calls, an mmap write), so a greenlet can never wait for a lock another greenlet of
its thread holds, and a plain lock is enough; between real threads it is the lock it always
was. Use ``thread_lock()`` only for such sections: a section that can switch greenlets keeps
``threading.Lock``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def _factory() -> Callable[[], Any]:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return threading.Lock
    original: Callable[[], Any] = monkey.get_original("_thread", "allocate_lock")
    return original


thread_lock: Callable[[], Any] = _factory()
