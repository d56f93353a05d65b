"""The CPU a block of a test spends, for bounds on the work of one call."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Spent:
    seconds: float = 0.0


@contextlib.contextmanager
def cpu_spent() -> Iterator[Spent]:
    """The calling thread's CPU seconds in the block (``time.thread_time``: no other thread or
    process counts), with the cyclic collector kept out of it: a collection that falls inside would
    walk everything the test process holds (the other tests' modules and objects, tenths of a
    second late in a run), which is not the block's work. Nothing is collected before the block
    either: a full collection there costs as much (a third of a second late in a run) and changes
    nothing the block measures."""
    spent = Spent()
    enabled = gc.isenabled()
    gc.disable()
    started = time.thread_time()
    try:
        yield spent
    finally:
        spent.seconds = time.thread_time() - started
        if enabled:
            gc.enable()
