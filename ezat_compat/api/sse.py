"""The stream writer's side: upstream events read on their own greenlet (or thread) into a
bounded queue, so the writer can send a keep-alive while the upstream is silent and notices a
client that left (the ping is the disconnect probe). The only gevent-aware code.

Design: "Streaming is a generator: upstream events are read on their own greenlet/thread into
a queue"; style habit 8.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator
from typing import Any

PING: Any = object()
_END: Any = object()
QUEUE_SIZE = 256


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@functools.cache
def _gevent_patched() -> bool:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return False
    return bool(monkey.is_module_patched("socket"))


def _spawn(target: Any) -> None:
    if _gevent_patched():
        import gevent

        gevent.spawn(target)
    else:
        threading.Thread(target=target, daemon=True, name="ezat-upstream-reader").start()


def _queue() -> Any:
    if _gevent_patched():
        import gevent.queue

        return gevent.queue.Queue(QUEUE_SIZE)
    return queue.Queue(QUEUE_SIZE)


def pump(source: Iterator[Any], keepalive_s: float) -> Iterator[Any]:
    """Yield ``source``'s items, and ``PING`` after every ``keepalive_s`` without one.

    ``source`` is consumed on another greenlet/thread; its exceptions are re-raised here.
    Closing this generator stops the reader at its next item (close the upstream response
    too, so a reader blocked on the socket wakes up).
    """
    items = _queue()
    stopped = threading.Event()

    def put(item: Any) -> None:
        while not stopped.is_set():
            try:
                items.put(item, timeout=1.0)
                return
            except queue.Full:
                continue
            except Exception:  # gevent.queue.Full
                continue

    def read() -> None:
        try:
            for item in source:
                if stopped.is_set():
                    return
                put(item)
        except BaseException as exc:
            put(_Raised(exc))
        finally:
            put(_END)

    _spawn(read)
    try:
        while True:
            try:
                item = items.get(timeout=keepalive_s)
            except Exception:  # queue.Empty / gevent.queue.Empty
                yield PING
                continue
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stopped.set()


class StreamBody:
    """A response body around a stream generator that is always finalised: if the server
    closes the response before the first chunk was pulled (the client left while the headers
    were being written), ``on_abandon`` still runs so the upstream is closed and billed."""

    def __init__(self, generator: Iterator[bytes], on_abandon: Any) -> None:
        self._generator = generator
        self._on_abandon = on_abandon
        self._started = False

    def __iter__(self) -> Iterator[bytes]:
        self._started = True
        return self._generator

    def close(self) -> None:
        if not self._started:
            self._on_abandon()
        self._generator.close()


SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
