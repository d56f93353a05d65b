"""The stream writer: drives a ``StreamSession`` into the client's response.

The writer reads the upstream itself, each read waiting at most until the dialect's keep-alive
is due (``keepalive_s`` after the last write): then it sends the keep-alive, while the
upstream is silent or while the model thinks (events that produce no bytes), and notices a
client that left (the ping is the disconnect probe). One timer: the time of the last write.
The first event (read before the stream started) is written alone, at once: the first byte
waits for no translation of what came after it and no bill. Then the events of one upstream read
are translated together and written in one write (the reply's ending with them, billed first,
unless a peek finds the client gone); ``finally`` closes and bills. A reply that arrives whole
in the first read (a fast upstream) is two writes. A cut asked from another greenlet (a
shutdown) interrupts the upstream read.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator

from flask import Response

from ezat_compat.cooperative import YIELD_EVERY, tools
from ezat_compat.session import StreamSession

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def relay(session: StreamSession) -> Generator[bytes, None, None]:
    """The client's bytes: the session's translation of each upstream event, the keep-alive
    after ``keepalive_s`` without a write, and the session's ending."""
    keepalive_s = session.keepalive_s
    clock = time.monotonic
    pause = tools().pause
    relayed = 0  # events since the last pause
    try:
        head = session.head  # the first event's bytes: written alone, at once
        last_write = clock()
        held: list[tuple[str, str]] = []  # events read, fed at the next turn
        first = True  # until the first write: the head goes out alone
        while not session.over:
            parts = [head] if head else []
            head = b""
            if held:
                events, held = held, []
            elif first and parts:  # the head alone, at once
                events = []
            else:
                try:  # with the head to write, only what has already arrived
                    events = session.poll(0.0 if parts else keepalive_s - (clock() - last_write))
                except Exception as exc:
                    events = []
                    if session.cut_by is None:
                        parts.append(session.broke(exc))
            if session.cut_by is not None:  # the gateway is shutting down
                parts.append(session.cut(session.cut_by))
                yield b"".join(parts)
                return
            if not events and not parts:
                if session.upstream_ended:
                    yield session.ended()
                else:
                    yield session.ping
                    last_write = clock()
                continue
            for index, event in enumerate(events):
                if session.over:
                    break
                # The event that bills the reply goes out with the bytes before it, unless the
                # client has left: then those are written first, and their failed write bills
                # it as having left, not as served.
                if parts and session.bills(event) and any(parts) and session.client_gone():
                    held = events[index:]
                    break
                parts.append(session.relay(*event))
                relayed += 1
                if relayed >= YIELD_EVERY:  # a fast upstream: let the worker's other greenlets run
                    relayed = 0
                    pause()
            out = b"".join(parts) if len(parts) > 1 else parts[0] if parts else b""
            if out:
                yield out
                last_write = clock()
                first = False
            elif clock() - last_write >= keepalive_s:
                yield session.ping
                last_write = clock()
    except GeneratorExit:  # the client went away: close() bills what was produced
        raise
    except BaseException as exc:  # the worker stopped this greenlet (shutdown, kill): not the client
        session.abort(exc)
        raise
    finally:
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
    """The event-stream response. ``direct_passthrough``: the server iterates (and closes) the
    ``StreamBody`` itself, so no chunk goes through werkzeug's encoding and closing wrappers (a
    generator frame each); the body yields bytes only."""
    return Response(StreamBody(session), mimetype="text/event-stream", headers=SSE_HEADERS, direct_passthrough=True)
