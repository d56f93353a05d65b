"""Reading an upstream's server-sent events: sseclient-py, fed whole events as the bytes arrive.

Anthropic's streams are ``event:``/``data:`` lines ending in LF, each event closed by an empty
line, sent with ``Transfer-Encoding: chunked`` (Messages API, "Streaming"). sseclient-py
(``SSEClient(chunks).events()``) reads them as the WHATWG event-stream rules say, however the
bytes are split (``tests/unit/test_sse_decoder.py`` feeds it a recorded stream split at every
byte), except in one case a real upstream produces: a body that ends in the middle of an event
(the connection broke, a proxy cut it). sseclient-py dispatches that unterminated piece as an
event; WHATWG discards it, and so must we, or half an event's JSON reaches the translator as a
whole one.

sseclient-py pulls its bytes from an iterator, and a reader that waits for the upstream with a
deadline of its own (the stream writer, ``upstream/client.py``) can't be pulled from: it must
hand bytes in as they come and take back the events they complete. ``SSEDecoder`` does that with
sseclient-py's own API: it holds the bytes after the last place where an event ends (an empty
line: the ends sseclient-py splits events at, ``\\n\\n``, ``\\r\\r`` and ``\\r\\n\\r\\n``), and hands
sseclient-py only bytes up to such an end, so sseclient-py never holds half an event between two
reads and the decoder is never left waiting inside it. The bytes after the body's last end are
the unterminated piece: never handed over, so never an event.

The other cases where sseclient-py departs from WHATWG (a byte-order mark at the start, an LF
then a CRLF, bytes that aren't UTF-8) are not sent by any upstream we call; the decoder tests
list them.

``MAX_EVENT_BYTES`` bounds what one event may hold: an upstream that never ends an event can't
make the reader buffer without end (``EventTooLargeError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from sseclient import SSEClient

from ezat_compat.errors import UpstreamStreamError

MAX_EVENT_BYTES = 16 * 1024 * 1024
Event = tuple[str, str]  # (event type, data)
_LF = 0x0A


class EventTooLargeError(UpstreamStreamError):
    """The upstream sent an event larger than the reader takes: the stream is broken."""


class StreamDecoder(Protocol):
    """A provider's stream framing, fed as the body arrives (``SSEDecoder``, Bedrock's
    ``EventStreamDecoder``): ``feed`` gives the events its bytes complete, ``end`` those the
    body's end completes (an unterminated one is not one). A failure raises; the events of the
    same bytes that came before it are given first, the failure at the next call. ``most``: give
    at most that many events (0: all); the others the bytes complete are kept, not decoded yet,
    and given first by the next call (``feed(b"")`` gives them): a stream's first event goes on
    without waiting for the decoding of the rest of its read."""

    def feed(self, chunk: bytes, most: int = 0) -> list[Event]: ...

    def end(self) -> list[Event]: ...


def event_end(data: bytes, at_end: bool = False) -> int:
    """Where the last complete event of ``data`` ends (just past its empty line), or -1.

    The ends are sseclient-py's (``\\n\\n``, ``\\r\\n\\r\\n``, and ``\\r\\r`` unless an LF follows,
    which makes it a CR and a CRLF: known only once the next byte came, or at the body's end,
    ``at_end``). Cutting there leaves sseclient-py nothing of an event between two reads."""
    if data.endswith(b"\n\n"):  # Anthropic's events end so: one check
        return len(data)
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else -1, crlf + 4 if crlf >= 0 else -1)
    cr = data.rfind(b"\r\r")
    if cr >= 0 and cr + 2 > end:
        after = cr + 2
        if after < len(data):
            if data[after] != _LF:
                end = after
        elif at_end:
            end = after
    return end


class _Piece:
    """What sseclient-py reads at each ``events()``: the piece handed to it, then the end (a
    tuple's iterator: no Python call per chunk, no exception at its end)."""

    __slots__ = ("piece",)

    def __init__(self) -> None:
        self.piece = b""

    def __iter__(self) -> Iterator[bytes]:
        return iter((self.piece,))

    def __next__(self) -> bytes:  # an iterator, as sseclient-py's ``event_source`` is typed
        raise StopIteration


class SSEDecoder:
    """An SSE body's events, fed as it arrives (``StreamDecoder``), parsed by sseclient-py.

    ``feed`` keeps the bytes after the last event end (at most ``max_event_bytes``) and hands
    sseclient-py the complete events before it, as one piece: one ``SSEClient`` for the stream,
    whose ``events()`` reads the piece handed to it (``_Piece``) and ends with it, holding
    nothing (the piece ends where an event ends). A call cut short by ``most`` keeps that
    ``events()`` (the piece's other events, not decoded yet) for the next call."""

    __slots__ = ("_client", "_error", "_held", "_held_size", "_max_bytes", "_rest", "_source")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max_bytes = max_event_bytes
        self._held: list[bytes] = []  # the bytes after the last event end, as they came
        self._held_size = 0
        self._source = _Piece()
        self._client = SSEClient(self._source)
        self._rest: Iterator[Any] | None = None  # sseclient-py's events of a piece cut short by ``most``
        self._error: BaseException | None = None

    def feed(self, chunk: bytes, most: int = 0) -> list[Event]:
        if self._rest is not None:  # the events an earlier call kept come first
            rest = self._decoded(self._rest, 0)
            if self._error is not None or not chunk:  # a failure after them: at the next call
                return rest
            try:
                more = self._fed(chunk, most)
            except Exception as exc:
                if not rest:
                    raise
                exc.__traceback__ = None
                self._error = exc
                return rest
            return rest + more
        if self._error is not None:
            self._raise()
        if not chunk:
            return []
        return self._fed(chunk, most)

    def _fed(self, chunk: bytes, most: int) -> list[Event]:
        held = self._held
        if not held:
            end = event_end(chunk)
            if end == len(chunk):  # whole events, nothing left over: the common case
                return self._parse(chunk, most)
            if end < 0:
                self._hold(chunk)
                return []
            data, cut = chunk, end
        else:
            # An end may begin in the held bytes (a CRLF CRLF split between reads): look from their tail.
            tail = held[-1][-3:] if len(held[-1]) >= 3 else b"".join(held)[-3:]
            end = event_end(tail + chunk)
            if end < 0:
                self._hold(chunk)
                return []
            data = b"".join((*held, chunk))
            cut = self._held_size - len(tail) + end
            held.clear()
            self._held_size = 0
        events = self._parse(data[:cut], most)
        if cut < len(data):
            try:
                self._hold(data[cut:])
            except EventTooLargeError as exc:
                if not events:
                    raise
                exc.__traceback__ = None
                self._error = exc  # the events before it go on first
        return events

    def end(self) -> list[Event]:
        """The events the body's end completes (a ``\\r\\r`` at its very end); the rest held is
        an unterminated event, dropped (WHATWG)."""
        if self._rest is not None:  # the events an earlier call kept come first, then the end's
            kept = self.feed(b"")
            return kept if self._error is not None else kept + self.end()  # a failure: at the next call
        if self._error is not None:
            self._raise()
        if not self._held:
            return []
        data = b"".join(self._held)
        self._held.clear()
        self._held_size = 0
        cut = event_end(data, at_end=True)
        return self._parse(data[:cut]) if cut > 0 else []

    def _hold(self, data: bytes) -> None:
        self._held.append(data)
        self._held_size += len(data)
        if self._held_size > self._max_bytes:
            raise EventTooLargeError(f"the upstream sent an event larger than {self._max_bytes} bytes")

    def _parse(self, piece: bytes, most: int = 0) -> list[Event]:
        """sseclient-py's events of ``piece`` (whole events), at most ``most`` of them (0: all;
        the others stay in ``_rest``, decoded when asked)."""
        source = self._source
        source.piece = piece
        try:
            events = self._client.events()  # reads the piece when first resumed
            return self._decoded(events, most)
        finally:
            source.piece = b""

    def _decoded(self, events: Iterator[Any], most: int) -> list[Event]:
        """The (type, data) of sseclient-py's ``events``, up to ``most`` (0: all): the rest are
        kept in ``_rest``; a failure after some of them (bytes that aren't UTF-8) is kept for the
        next call, so the events before it go on first."""
        self._rest = None
        out: list[Event] = []
        try:
            for event in events:
                out.append((event.event, event.data))
                if len(out) == most:
                    self._rest = events
                    break
        except Exception as exc:
            if not out:
                raise
            exc.__traceback__ = None  # kept: not with this frame, which holds the decoder
            self._error = exc
        return out

    def _raise(self) -> None:
        error, self._error = self._error, None
        assert error is not None
        raise error


def pulled(
    decoder: StreamDecoder, chunks: Iterable[bytes], before_read: Callable[[], None] | None = None
) -> Iterator[Event]:
    """``decoder``'s events of the body's ``chunks``, pulled: each event as soon as the chunk
    that completes it was read. ``before_read`` is called before each further chunk is read: by
    then every complete event of the chunks read so far has been given."""
    source = iter(chunks)
    while True:
        if before_read is not None:
            before_read()
        chunk = next(source, None)
        if chunk is None:
            break
        yield from decoder.feed(chunk)
    yield from decoder.end()


def iter_sse(
    chunks: Iterable[bytes],
    *,
    max_event_bytes: int = MAX_EVENT_BYTES,
    before_read: Callable[[], None] | None = None,
) -> Iterator[Event]:
    """(event type, data) of each complete event in the body's ``chunks`` (``message`` when an
    event names no type); an event the body's end cut off is not one (``SSEDecoder``, pulled)."""
    return pulled(SSEDecoder(max_event_bytes), chunks, before_read)
