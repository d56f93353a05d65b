"""The stream writer: drives a ``StreamSession`` into the client's response. The only
gevent-aware code.

The upstream's events are read on their own greenlet (or thread) into a bounded queue, so the
writer can send the dialect's keep-alive after ``keepalive_s`` without a write — while the
upstream is silent or while the model thinks (events that produce no bytes) — and notices a
client that left: the ping is the disconnect probe. One timer: the time of the last write.

The stream is a generator: upstream events are read on their own greenlet (or thread) into a
queue; each one is parsed, translated and encoded, the events already queued with it are
written together in one write, and ``finally`` closes and bills.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

from flask import Response

from ezat_compat.session import StreamSession

QUEUE_SIZE = 256
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_SILENCE: Any = object()
_END: Any = object()
_CUT: Any = object()


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


class Reader:
    """Consumes ``source`` on another greenlet/thread; ``get`` waits at most ``timeout``.

    ``get`` returns an item, ``_SILENCE`` when none came in time, ``_END`` at the end, or a
    ``_Raised`` with what the source raised. ``stop`` makes the reader quit at its next item
    (close the upstream too, so a reader blocked on the socket wakes up).
    """

    def __init__(self, source: Iterator[Any]) -> None:
        self._source = source
        self._stopped = threading.Event()
        if _gevent_patched():
            import gevent
            import gevent.queue

            self._items: Any = gevent.queue.Queue(QUEUE_SIZE)
            gevent.spawn(self._read)
        else:
            self._items = queue.Queue(QUEUE_SIZE)
            threading.Thread(target=self._read, daemon=True, name="ezat-upstream-reader").start()

    def _put(self, item: Any) -> None:
        while not self._stopped.is_set():
            try:
                self._items.put(item, timeout=1.0)
                return
            except Exception:  # queue.Full / gevent.queue.Full
                continue

    def _read(self) -> None:
        try:
            for item in self._source:
                if self._stopped.is_set():
                    return
                self._put(item)
        except BaseException as exc:
            self._put(_Raised(exc))
        finally:
            self._put(_END)

    def get(self, timeout: float) -> Any:
        try:
            return self._items.get(timeout=max(timeout, 0.0))
        except Exception:  # queue.Empty / gevent.queue.Empty
            return _SILENCE

    def ready(self) -> Any:
        """The next item if one is already queued, else ``_SILENCE`` (never waits)."""
        try:
            return self._items.get_nowait()
        except Exception:  # queue.Empty / gevent.queue.Empty
            return _SILENCE

    def stop(self) -> None:
        self._stopped.set()

    def interrupt(self) -> None:
        """Wake ``get`` at once (the session was asked to end)."""
        with contextlib.suppress(Exception):  # full: the writer is busy and sees the cut at its next item
            self._items.put_nowait(_CUT)


def _translate(session: StreamSession, item: Any) -> bytes:
    """The client's bytes for one item of the reader (an event, the end, or what broke)."""
    if item is _CUT:  # woken to see a cut that another item already ended, or none
        return b""
    if item is _END:
        return session.ended()
    if type(item) is _Raised:
        return session.broke(item.exc)
    try:
        return session.feed(*item)
    except Exception as exc:
        return session.broke(exc)


def relay(session: StreamSession) -> Generator[bytes, None, None]:
    """The client's bytes: the session's translation of each upstream event, the keep-alive
    after ``keepalive_s`` without a write, and the session's ending."""
    reader = Reader(session.events)
    session.interrupt = reader.interrupt
    keepalive_s = session.keepalive_s
    clock = time.monotonic
    try:
        if session.head:
            yield session.head
        last_write = clock()
        held: Any = None  # an item taken from the reader, fed at the next turn
        while not session.over:
            if held is not None:
                item, held = held, None
            else:
                item = reader.get(keepalive_s - (clock() - last_write))
            if session.cut_by is not None:  # the gateway is shutting down
                yield session.cut(session.cut_by)
                return
            if item is _SILENCE:
                yield session.ping
                last_write = clock()
                continue
            parts = [_translate(session, item)]
            # What the upstream already sent is written with it, in one write: events come in
            # bursts (one TCP read holds several), and a write per event costs a send each. The
            # event that bills the reply waits for the next write: a client that left makes
            # that write fail before it is billed as served.
            for _ in range(QUEUE_SIZE):
                if session.over:
                    break
                item = reader.ready()
                if item is _SILENCE:
                    break
                if session.cut_by is not None:
                    parts.append(session.cut(session.cut_by))
                    break
                if session.bills(item) and any(parts):  # what came before goes out first
                    held = item
                    break
                parts.append(_translate(session, item))
            out = b"".join(parts) if len(parts) > 1 else parts[0]
            if out:
                yield out
                last_write = clock()
            elif clock() - last_write >= keepalive_s:
                yield session.ping
                last_write = clock()
    except GeneratorExit:  # the client went away: close() bills what was produced
        raise
    except BaseException as exc:  # the worker stopped this greenlet (shutdown, kill): not the client
        session.abort(exc)
        raise
    finally:
        reader.stop()
        session.close()


class StreamBody:
    """A response body that always ends its session: also when the server closes the response
    before the first chunk was pulled (the client left while the headers were being written)."""

    def __init__(self, session: StreamSession) -> None:
        self._session = session
        self._chunks = relay(session)

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._chunks.close()
        self._session.close()


def stream_response(session: StreamSession) -> Response:
    return Response(StreamBody(session), mimetype="text/event-stream", headers=SSE_HEADERS)
