"""Request bodies read under a deadline, so a slow client can't hold a worker's connections.

A body gets ``[server] body_grace_s`` seconds, plus the time its size takes at
``body_min_rate_kbps`` (32 MB: 10 s + 512 s at the defaults): a body that hasn't arrived by
then is answered 408 (``RequestTimeoutError``) and its connection closed. Every read is bounded
by a gevent ``Timeout`` (the socket read otherwise blocks its greenlet for as long as the
client likes).

What bounds the connections slow bodies hold: gunicorn serves at most ``worker_connections``
connections per worker and stops accepting when they are all taken, so slow bodies must never
fill them. At most ``BODY_READERS_SHARE`` of them may be reading a body at once; a new reader
past that evicts the oldest one (answered 408 at once). A fresh request — whose body is usually
already in the socket's buffer — always gets a connection and its body read, while the oldest
slow bodies make room. After a 408 the socket (the WSGI environ's ``gunicorn.socket``) is shut
down once the answer is written, so the worker ends the connection instead of reading the rest
of the body. gunicorn offers no setting for a ``Connection: close`` of the app's (it drops the
header), and its request object is not ours to change: the close is the socket's.

This module, ``api/sse.py`` and ``cooperative.py`` are the gevent-aware code.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import gevent
from gevent import Greenlet

from ezat_compat.domain import ServerSettings
from ezat_compat.errors import RequestTimeoutError

READ_CHUNK = 64 * 1024
BODY_READERS_SHARE = 0.75  # of worker_connections
_KIB = 1024


class _Late(Exception):
    """The body's deadline passed (internal)."""


class _Evicted(Exception):
    """The reader was evicted to make room for a newer one (internal)."""


def close_connection(environ: dict[str, Any]) -> Callable[[], None] | None:
    """A callback to run once the response is sent, which shuts the connection's socket down
    (None when the server gives the app no socket)."""
    sock = environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return None

    def shut() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    return shut


class BodyReaders:
    """The body readers of one process: at most ``cap`` at once, the oldest evicted past it."""

    def __init__(self) -> None:
        self._reading: dict[Greenlet[Any, Any] | Any, None] = {}  # insertion order: oldest first
        self._doomed: set[Any] = set()

    def __len__(self) -> int:
        return len(self._reading)

    @contextlib.contextmanager
    def reading(self, cap: int) -> Iterator[None]:
        current = self.start(cap)
        try:
            yield
        finally:
            self.stop(current)

    def start(self, cap: int) -> Any:
        """The current greenlet starts reading (the oldest readers past ``cap`` evicted); call
        ``stop`` with what this returns when it is done (``reading`` as plain calls: no
        generator per body)."""
        current = gevent.getcurrent()
        reading = self._reading
        if len(reading) >= cap:
            cap = max(1, cap)
            while len(reading) >= cap:
                oldest = next(iter(reading))
                del reading[oldest]
                self._doomed.add(oldest)
                gevent.get_hub().loop.run_callback(self._evict, oldest)
        reading[current] = None
        return current

    def stop(self, current: Any) -> None:
        self._reading.pop(current, None)
        self._doomed.discard(current)

    def _evict(self, victim: Any) -> None:
        # Runs in the hub: the victim, still doomed, is paused in its body read (its only
        # switch point inside ``reading``), so the exception lands there.
        if victim in self._doomed:
            self._doomed.discard(victim)
            victim.throw(_Evicted)


READERS = BodyReaders()


def _budget_s(settings: ServerSettings, size: int) -> float:
    return settings.body_grace_s + size / (settings.body_min_rate_kbps * _KIB)


def read_within(
    stream: BinaryIO, length: int | None, settings: ServerSettings, max_bytes: int, too_large: Callable[[], Exception]
) -> bytes:
    """The body (``length`` bytes, or a chunked one to its end) within its deadline; 408
    ``RequestTimeoutError`` past it, ``too_large()`` past ``max_bytes``."""
    started = time.monotonic()
    chunks: list[bytes] = []
    total = 0
    cap = max(1, int(settings.worker_connections * BODY_READERS_SHARE))
    reader = READERS.start(cap)
    try:
        try:
            if length is not None:
                with gevent.Timeout(_budget_s(settings, length), _Late):
                    while total < length:
                        chunk = stream.read(min(READ_CHUNK * 16, length - total))
                        if not chunk:
                            break  # the client closed: what arrived is the body (the JSON is then invalid)
                        total += len(chunk)
                        chunks.append(chunk)
                return b"".join(chunks)
            while True:
                remaining = started + _budget_s(settings, total + READ_CHUNK) - time.monotonic()
                if remaining <= 0:
                    raise _Late
                with gevent.Timeout(remaining, _Late):
                    chunk = stream.read(READ_CHUNK)
                if not chunk:
                    return b"".join(chunks)
                total += len(chunk)
                if total > max_bytes:
                    raise too_large()
                chunks.append(chunk)
        finally:
            READERS.stop(reader)
    except (_Late, _Evicted) as exc:
        elapsed = time.monotonic() - started
        what = f"of {length} bytes" if length is not None else f"(chunked, {total} bytes so far)"
        why = (
            "the gateway needed the connection for newer requests"
            if isinstance(exc, _Evicted)
            else f"a body may take {settings.body_grace_s:g} s plus {settings.body_min_rate_kbps:g} KiB/s"
        )
        raise RequestTimeoutError(
            f"The request body {what} did not arrive in time: {elapsed:.1f} s ({why}). Send the whole body promptly."
        ) from None
