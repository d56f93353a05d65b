"""Giving a worker's memory back to the system after a very large request.

A 30 MB JSON body becomes hundreds of MB of Python objects while it is parsed and translated.
Once the answer is written they are freed, but the C allocator keeps the freed pages for later:
CPython's small-object arenas and glibc's heap are returned only when whole, and glibc raises
its ``mmap`` threshold after freeing a large block, so the next large block comes from the heap
it then keeps. A worker that served one such request would stay hundreds of MB larger for the
rest of its life. After a request whose body was at least ``TRIM_AFTER_BYTES``, glibc's
``malloc_trim(0)`` hands the free pages back (a few ms, only after such a request); on a C
library without it (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_AFTER_BYTES = 8 * 1024 * 1024


def _load_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_trim = _load_trim()


def after_request_of(body_bytes: int) -> bool:
    """Give free memory back when the request that just ended had a body of ``body_bytes`` at
    least ``TRIM_AFTER_BYTES`` long; whether it did."""
    if body_bytes < TRIM_AFTER_BYTES or _trim is None:
        return False
    _trim(0)
    return True
