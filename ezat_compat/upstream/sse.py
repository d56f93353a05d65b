"""Reading an upstream's server-sent events: sseclient-py, with the one fix a real upstream needs.

Anthropic's streams are ``event:``/``data:`` lines ending in LF, each event closed by an empty
line, sent with ``Transfer-Encoding: chunked`` (Messages API, "Streaming"). sseclient-py
(``SSEClient(chunks).events()``) reads them as the WHATWG event-stream rules say, however the
bytes are split (``tests/unit/test_sse_decoder.py`` feeds it a recorded stream split at every
byte), except in one case a real upstream produces: a body that ends in the middle of an event
(the connection broke, a proxy cut it). sseclient-py dispatches that unterminated piece as an
event; WHATWG discards it, and so must we, or half an event's JSON reaches the translator as a
whole one. ``_Chunks`` notes when the body ran out; an event that sseclient-py dispatches after
that is the unterminated piece, and is dropped.

The other cases where sseclient-py departs from WHATWG (a byte-order mark at the start, line
endings that mix CR and LF across a chunk boundary, bytes that aren't UTF-8) are not sent by
any upstream we call; the decoder tests list them.

``MAX_EVENT_BYTES`` bounds what one event may hold: an upstream that never ends an event can't
make the reader buffer without end (``EventTooLargeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from sseclient import SSEClient

from ezat_compat.errors import UpstreamStreamError

MAX_EVENT_BYTES = 16 * 1024 * 1024
Event = tuple[str, str]  # (event type, data)


class EventTooLargeError(UpstreamStreamError):
    """The upstream sent an event larger than the reader takes: the stream is broken."""


class _Chunks:
    """The body's chunks for sseclient-py: notes the body's end (``ended``), and how many bytes
    came since an event last ended; calls ``before_read`` before it reads the next chunk."""

    __slots__ = ("_before_read", "_chunks", "_max_bytes", "_open_bytes", "ended")

    def __init__(self, chunks: Iterable[bytes], max_bytes: int, before_read: Callable[[], None] | None) -> None:
        self._chunks = iter(chunks)
        self._max_bytes = max_bytes
        self._open_bytes = 0
        self._before_read = before_read
        self.ended = False

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> bytes:
        if self._before_read is not None:
            self._before_read()
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self.ended = True
            raise
        end = max(chunk.rfind(b"\n\n"), chunk.rfind(b"\r\r"), chunk.rfind(b"\n\r\n"))  # where an event last ended
        self._open_bytes = len(chunk) - end if end >= 0 else self._open_bytes + len(chunk)
        if self._open_bytes > self._max_bytes:
            raise EventTooLargeError(f"the upstream sent an event larger than {self._max_bytes} bytes")
        return chunk

    def close(self) -> None:  # what sseclient-py's ``close`` calls
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def iter_sse(
    chunks: Iterable[bytes],
    *,
    max_event_bytes: int = MAX_EVENT_BYTES,
    before_read: Callable[[], None] | None = None,
) -> Iterator[Event]:
    """(event type, data) of each complete event in the body's ``chunks`` (``message`` when an
    event names no type); an event the body's end cut off is not one.

    ``before_read`` is called before each further chunk is read: by then every complete event
    of the chunks read so far has been yielded (sseclient-py asks for a chunk only when it has
    none left to give), so a reader can hand the events of one read on together."""
    source = _Chunks(chunks, max_event_bytes, before_read)
    events = SSEClient(source).events()
    while True:
        try:
            event = next(events)
        except StopIteration:
            return
        except UnicodeDecodeError:
            if source.ended:  # the unterminated piece, cut inside a character: discarded all the same
                return
            raise
        if source.ended:  # dispatched only because the body ended: unterminated (WHATWG: discarded)
            return
        yield event.event, event.data
