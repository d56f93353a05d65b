"""What a gevent worker's code needs to share the event loop, decided once per process.

Under gevent's patched sockets (a gunicorn worker) a greenlet that never waits holds every other
greenlet of the worker: their keep-alives, their timers, their reads. Code that can run long
without waiting — relaying a fast upstream's events, reading a response head that trickles —
uses these, and gets plain-thread equivalents outside gevent (tests, tools):

- ``readiness(fd)``: a wait for a socket to become readable, bounded by a time, that another
  greenlet (or thread) can cut short (``Readiness``): an IO watcher and a timer waking one
  gevent ``Waiter``, else ``poll`` on the socket and a pipe. A reader that only reads what is already there and waits
  with this in between never has a read cut mid-way (a timeout inside a read loses the bytes
  CPython's buffered reader had copied before it);
- ``pause()``: a wait for the event loop's next turn, which runs timers and polls sockets (a
  sleep > 0: ``sleep(0)`` only runs the callbacks that are ready, and the loop polls once per
  ~50 of them); nothing outside gevent, where threads are preempted anyway. Callers pause every
  ``YIELD_EVERY`` events in a row;
- ``bound(seconds, error)``: a wall-clock bound on a block of socket reads
  (``gevent.Timeout(seconds, error)``: ``error`` raised where the block waits; one timer, no
  system call); nothing outside gevent, where each read's own timeout bounds it;
- ``own_turn()``: a context manager for one step heavier than a loop's turn should hold (a
  stored page read from a huge input): one such step at a time in the process, each starting
  on a turn of the event loop of its own, so timers due (another stream's keep-alive) run
  between two of them however many arrive at once (greenlets woken together all run before the
  loop looks at its timers again); nothing outside gevent;
- ``off_loop(work)``: ``work()`` on one of the hub's real OS threads (gevent's threadpool),
  the calling greenlet waiting cooperatively: for CPU-heavy library calls that release the GIL
  (Pillow's decoders and resamplers), so the loop goes on meanwhile; called in place outside
  gevent, where the caller is a thread already.

``readable_now(sock)`` asks the OS, without waiting and without the event loop, whether a socket
has something to read (bytes, its end, an error): one ``poll`` system call.

``tools()`` chooses once per process (a forked worker chooses again: gunicorn's gevent worker
patches after the fork).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ezat_compat.procid import pid

YIELD_EVERY = 256  # events handled in a row before the greenlet lets the others run
PAUSE_S = 1e-6  # > 0: a wait for the event loop's next turn

Bound = Callable[[float, BaseException], contextlib.AbstractContextManager[Any]]


class Readiness(Protocol):
    """A wait for one socket to become readable (``tools().readiness(fd)``); ``close`` it."""

    def wait(self, seconds: float) -> bool:
        """True when the socket is readable (or at its end, or broken: a read won't wait);
        False when ``seconds`` ran out or ``wake`` was called."""
        ...

    def wake(self) -> None:
        """End a ``wait`` in progress (from another greenlet or thread); none in progress: nothing."""
        ...

    def close(self) -> None: ...


_os_poll: Callable[[], Any] | None = None


def readable_now(sock: Any) -> bool:
    """Whether ``sock`` (or a file descriptor) has something to read this instant: the OS's own
    ``poll`` with no wait, even under gevent's patches (gevent's ``poll`` and ``select`` are a
    turn of the event loop: watchers, a timer, a switch to the hub and back; ``select`` also
    refuses a descriptor past 1023, which a worker holding a thousand streams has). Raises
    ``ValueError`` for a closed socket."""
    global _os_poll
    make = _os_poll
    if make is None:
        from gevent.monkey import get_original

        make = _os_poll = get_original("select", "poll")
    poller = make()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _no_pause() -> None:
    """Outside gevent: a thread is preempted anyway."""


def _no_bound(seconds: float, error: BaseException) -> contextlib.AbstractContextManager[Any]:
    """Outside gevent: nothing (the read timeout bounds each read)."""
    return contextlib.nullcontext()


class _PolledReadiness:
    """Outside gevent: ``poll`` on the socket and on a pipe that ``wake`` writes to."""

    __slots__ = ("_poller", "_wake_r", "_wake_w")

    def __init__(self, fd: int) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)

    def wait(self, seconds: float) -> bool:
        ready = self._poller.poll(math.ceil(max(seconds, 0.0) * 1000))
        if any(fd == self._wake_r for fd, _ in ready):
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)
            return False
        return bool(ready)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending already) or closed
            os.write(self._wake_w, b"w")

    def close(self) -> None:
        self.wake()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class _GeventReadiness:
    """Under gevent: an IO watcher on the socket and a timer, both calling one ``Waiter``
    (gevent's hub primitives, as ``gevent.socket.wait`` and ``Timeout`` use them, without a
    ``Timeout`` object or an exception per wait: an idle stream waits here, and its greenlet's
    saved stack and what the wait holds are its memory). ``wake`` switches the waiter from the
    hub's next turn; a waiter already woken just keeps the value."""

    __slots__ = ("_closing", "_hub", "_io", "_new_waiter", "_waiter")

    def __init__(self, fd: int) -> None:
        from gevent import get_hub
        from gevent.hub import Waiter

        self._hub = get_hub()
        self._io = self._hub.loop.io(fd, 1)
        self._new_waiter = Waiter
        self._waiter: Any = None
        self._closing = False

    def wait(self, seconds: float) -> bool:
        hub = self._hub
        waiter: Any = self._new_waiter(hub)
        timer = hub.loop.timer(max(seconds, 0.0))
        self._io.start(waiter.switch, True)
        timer.start(waiter.switch, False, update=True)  # from now, not from the loop's last turn
        self._waiter = waiter
        try:
            return bool(waiter.get())
        finally:
            self._waiter = None
            self._io.stop()
            timer.close()
            if self._closing:
                self._io.close()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._hub.loop.run_callback(waiter.switch, False)

    def close(self) -> None:
        if self._waiter is not None:  # another greenlet waits: woken, it closes the watcher
            self._closing = True
            self.wake()
            return
        self._io.close()


def _no_turn() -> contextlib.AbstractContextManager[Any]:
    """Outside gevent: threads are preempted anyway."""
    return contextlib.nullcontext()


class _OwnTurns:
    """Under gevent: one step at a time (a gevent lock of the process), each after a pause, so it
    starts on a turn of the loop that ran the timers due first (``own_turn``)."""

    __slots__ = ("_lock", "_pause")

    def __init__(self, pause: Callable[[], None]) -> None:
        from gevent.lock import Semaphore

        self._lock = Semaphore(1)
        self._pause = pause

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            self._pause()
            yield


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
    readiness: Callable[[int], Readiness]
    pause: Callable[[], None]
    bound: Bound
    off_loop: Callable[[Callable[[], Any]], Any] = _in_place
    own_turn: Callable[[], contextlib.AbstractContextManager[Any]] = _no_turn


PLAIN = Tools(readiness=_PolledReadiness, pause=_no_pause, bound=_no_bound)
_chosen: tuple[int, Tools] | None = None


def _choose() -> Tools:
    try:
        from gevent import Timeout, monkey, sleep

        if monkey.is_module_patched("socket"):
            pause = partial(sleep, PAUSE_S)
            return Tools(
                readiness=_GeventReadiness,
                pause=pause,
                bound=lambda seconds, error: Timeout(max(seconds, 0.001), error),
                off_loop=_on_hub_threadpool,
                own_turn=_OwnTurns(pause),
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
