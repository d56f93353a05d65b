"""An incremental Server-Sent Events decoder for reading the upstream's stream.

It follows the WHATWG "event stream interpretation" rules
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- the bytes are UTF-8 (invalid sequences become U+FFFD; one leading BOM is dropped), and a
  character split across chunks is decoded once its last byte arrives;
- lines end with CRLF, LF or CR, also when a CRLF is split across two chunks; no other
  character (U+2028, U+0085, form feed…) ends a line;
- a line starting with ``:`` is a comment; otherwise the field name is what precedes the
  first ``:`` (the whole line when there is none) and one leading space of the value is
  dropped; ``event`` sets the type, ``data`` lines are joined with ``\\n``, ``id`` (without NUL)
  and ``retry`` (ASCII digits only) are kept on the decoder, other fields are ignored;
- a blank line dispatches the event, unless it has no ``data`` line; the type then resets to
  ``message``; at end of stream an unterminated event is discarded.

It does no I/O: feed it the body's chunks as they arrive (``iter_content(chunk_size=None)``,
not the 128-byte default) and handle each completed ``(event, data)`` right away. Work is
linear in the bytes fed, however they are split, and memory is one event at most.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator

from ezat_compat.errors import GatewayError

# An event (or a line) larger than this is refused rather than buffered without end. Anthropic's
# largest events (server-tool results) are far smaller.
MAX_EVENT_CHARS = 16 * 1024 * 1024

# What a server such as Anthropic's sends: whole events of one ``event: <type>`` line and one
# ``data: <value>`` line. A chunk of nothing but such events, read with no event half-done,
# gives the same pairs as the line rules (the type and the value after one space; no comment,
# ``id`` or ``retry`` line that could change state), in one regex pass.
_PLAIN_EVENTS = re.compile(r"(?:event: [^\n]+\ndata: [^\n]*\n\n)+")
_PLAIN_EVENT = re.compile(r"event: ([^\n]+)\ndata: ([^\n]*)\n\n")


class SSEDecoder:
    """Bytes in, completed ``(event type, data)`` pairs out; one decoder per stream."""

    __slots__ = (
        "_data",
        "_data_chars",
        "_decoder",
        "_event",
        "_line",
        "_line_chars",
        "_max_chars",
        "_skip_lf",
        "_started",
        "last_event_id",
        "retry",
    )

    def __init__(self, *, max_event_chars: int = MAX_EVENT_CHARS) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._line: list[str] = []  # pieces of the line not yet terminated
        self._line_chars = 0
        self._skip_lf = False  # the last chunk ended with CR: a LF starting the next one belongs to it
        self._started = False  # the first character (maybe a BOM) has been seen
        self._event = ""
        self._data: list[str] = []
        self._data_chars = 0
        self._max_chars = max_event_chars
        self.last_event_id = ""  # the ``id`` field's value; kept across events, as the spec says
        self.retry: int | None = None  # the ``retry`` field's value in milliseconds, if one came

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Decode one chunk of the body; returns the events it completed, in order.

        Raises ``GatewayError`` when a line or an event grows past ``max_event_chars``.
        """
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
                if not text:
                    return []
        if self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\r" in text:
            # A CR ends a line at once; if it is the first half of a CRLF, the LF is dropped later.
            self._skip_lf = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        elif (
            not self._line
            and not self._data
            and not self._event
            and len(text) <= self._max_chars
            and _PLAIN_EVENTS.fullmatch(text)
        ):
            return _PLAIN_EVENT.findall(text)
        elif "\n" not in text:  # no line ended in this chunk
            self._line.append(text)
            self._line_chars += len(text)
            if self._line_chars > self._max_chars:
                self._too_large()
            return []
        lines = text.split("\n")
        rest = lines.pop()
        if self._line:
            self._line.append(lines[0])
            lines[0] = "".join(self._line)
            self._line = []
        out = self._lines(lines)
        if rest:
            self._line.append(rest)
        self._line_chars = len(rest)
        return out

    def _lines(self, lines: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        data = self._data
        event = self._event
        for line in lines:
            if not line:  # dispatch
                if data:
                    out.append((event or "message", "\n".join(data)))
                    data = []
                    self._data_chars = 0
                event = ""
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value and value[0] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
                self._data_chars += len(value) + 1  # with the "\n" that joins it to the next line
                if self._data_chars - 1 > self._max_chars:
                    self._too_large()
            elif name == "event":
                event = value
            elif name == "id":
                if "\0" not in value:
                    self.last_event_id = value
            elif name == "retry" and value.isascii() and value.isdigit():
                self.retry = int(value)
        self._data = data
        self._event = event
        return out

    def flush(self) -> list[tuple[str, str]]:
        """End of stream: discard an unterminated line or event (the spec never dispatches it).

        Returns the events still to dispatch, which is always none: every complete event was
        returned by ``feed``. The decoder is then ready for a new stream.
        """
        self._decoder.decode(b"", True)
        self._decoder.reset()
        self._line = []
        self._line_chars = 0
        self._skip_lf = False
        self._started = False
        self._event = ""
        self._data = []
        self._data_chars = 0
        return []

    def _too_large(self) -> None:
        self.flush()
        raise GatewayError(f"The upstream sent a stream event larger than {self._max_chars} characters.")


def iter_sse(chunks: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """``(event type, data)`` for each event of a body given as chunks of bytes."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.flush()
