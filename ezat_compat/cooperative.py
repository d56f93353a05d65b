"""What a gevent worker's code needs to share the event loop, decided once per process.

Under gevent's patched sockets (a gunicorn worker) a greenlet that never waits holds every other
greenlet of the worker: their keep-alives, their timers, their reads. Code that can run long
without waiting — relaying a fast upstream's events, reading a response head that trickles —
uses these, and gets plain-thread equivalents outside gevent (tests, tools):

- ``spawn(target)``: a greenlet, else a daemon thread;
- ``pause()``: a wait for the event loop's next turn, which runs timers and polls sockets (a
  sleep > 0: ``sleep(0)`` only runs the callbacks that are ready, and the loop polls once per
  ~50 of them); nothing outside gevent, where threads are preempted anyway. Callers pause every
  ``YIELD_EVERY`` events in a row;
- ``bound(seconds, error)``: a wall-clock bound on a block of socket reads
  (``gevent.Timeout(seconds, error)``: ``error`` raised where the block waits; one timer, no
  system call); nothing outside gevent, where each read's own timeout bounds it;
- ``off_loop(work)``: ``work()`` on one of the hub's real OS threads (gevent's threadpool),
  the calling greenlet waiting cooperatively: for CPU-heavy library calls that release the GIL
  (Pillow's decoders and resamplers), so the loop goes on meanwhile; called in place outside
  gevent, where the caller is a thread already.

``tools()`` chooses once per process (a forked worker chooses again: gunicorn's gevent worker
patches after the fork).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ezat_compat.procid import pid

YIELD_EVERY = 256  # events handled in a row before the greenlet lets the others run
PAUSE_S = 1e-6  # > 0: a wait for the event loop's next turn

Bound = Callable[[float, BaseException], contextlib.AbstractContextManager[Any]]
Spawn = Callable[[Callable[[], None]], Any]


def _no_pause() -> None:
    """Outside gevent: a thread is preempted anyway."""


def _no_bound(seconds: float, error: BaseException) -> contextlib.AbstractContextManager[Any]:
    """Outside gevent: nothing (the read timeout bounds each read)."""
    return contextlib.nullcontext()


def _thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, name="ezat-upstream-stream", daemon=True)
    thread.start()
    return thread


def _in_place(work: Callable[[], Any]) -> Any:
    """Outside gevent: the caller's own thread does the work."""
    return work()


def _on_hub_threadpool(work: Callable[[], Any]) -> Any:
    """``work()`` on a hub thread; its exception is raised here, in the caller (gevent's pool
    would print a task's exception with its arguments, an image's bytes among them)."""
    from gevent import get_hub

    def caught() -> tuple[bool, Any]:
        try:
            return True, work()
        except BaseException as exc:  # handed to the caller, who raises it
            return False, exc

    done, value = get_hub().threadpool.apply(caught)
    if done:
        return value
    raise value


@dataclass(frozen=True, slots=True)
class Tools:
    spawn: Spawn
    pause: Callable[[], None]
    bound: Bound
    off_loop: Callable[[Callable[[], Any]], Any] = _in_place


PLAIN = Tools(spawn=_thread, pause=_no_pause, bound=_no_bound)
_chosen: tuple[int, Tools] | None = None


def _choose() -> Tools:
    try:
        from gevent import Timeout, monkey, sleep, spawn

        if monkey.is_module_patched("socket"):
            return Tools(
                spawn=spawn,
                pause=partial(sleep, PAUSE_S),
                bound=lambda seconds, error: Timeout(max(seconds, 0.001), error),
                off_loop=_on_hub_threadpool,
            )
    except ImportError:  # pragma: no cover - gevent is a dependency
        pass
    return PLAIN


def tools() -> Tools:
    """This process's tools (module docstring)."""
    global _chosen
    chosen = _chosen
    if chosen is None or chosen[0] != pid():
        chosen = _chosen = (pid(), _choose())
    return chosen[1]
