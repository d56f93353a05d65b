"""A response's head goes out with its first body bytes, in one send (gunicorn workers).

gunicorn's ``Response.write`` sends the status line and header fields with one ``sendall`` and
then each body write with another. On loopback, and behind nginx or HAProxy on the same host,
a send is mostly the kernel's TCP path (the receiver's side runs in the sender's system call),
so the separate head costs a system call, a TCP segment and a wake-up of the proxy per
response. ``install`` makes the first non-empty body write of a response send the head and
those bytes together (chunk framing included); everything else — an empty first write, a
response that has no body, a ``Content-Length`` shorter than the write, ``close`` and
``sendfile`` — stays gunicorn's own code. A body's last bytes marked ``LastChunk`` (a
stream's ending) go out with the end of the chunked body (``0\r\n\r\n``) in the same send,
and ``close`` then has nothing left to send. The bytes on the wire are the same.

Each of these sends is one ``send`` call (``netio.send_all``). The ``Date`` field, which has a
resolution of one second, is formatted once a second instead of once a response.

Applied in each worker (``gunicorn_conf.post_worker_init``), once, only to the gunicorn
version whose ``Response`` has the attributes it relies on; otherwise gunicorn is left as is.
"""

from __future__ import annotations

import time
from typing import Any

from ezat_compat.netio import send_all

# What the patched write uses: gunicorn 23 and later (``_omits_body`` came with 23.0).
_NEEDED = ("write", "send_headers", "default_headers", "_response_omits_body")


class LastChunk(bytes):
    """The last bytes of a response body (a ``bytes`` to any server: only the patched write
    treats it otherwise)."""

    __slots__ = ()


def once_a_second(http_date: Any) -> Any:
    """gunicorn's ``util.http_date``, formatted once per second of the clock (its text has
    whole seconds: the same text)."""
    last: list[Any] = [None, ""]

    def cached(timestamp: float | None = None) -> str:
        if timestamp is not None:
            return str(http_date(timestamp))
        now = int(time.time())
        if now != last[0]:
            last[0], last[1] = now, str(http_date(now))
        return str(last[1])

    cached._ezat_cached = True  # type: ignore[attr-defined]
    return cached


def install() -> bool:
    """Patch gunicorn's ``Response.write`` (idempotent); whether it is patched."""
    from gunicorn import util  # type: ignore[import-untyped]
    from gunicorn.http import wsgi  # type: ignore[import-untyped]

    response_class: Any = wsgi.Response
    if getattr(response_class, "_ezat_one_send", False):
        return True
    if not all(hasattr(response_class, name) for name in _NEEDED):
        return False
    if not getattr(util.http_date, "_ezat_cached", False):
        util.http_date = once_a_second(util.http_date)
    original_write = response_class.write
    original_close = response_class.close

    def write(self: Any, arg: Any) -> None:
        kind = type(arg)
        last = kind is LastChunk and self.chunked
        if self.headers_sent and self.chunked and not last and kind is bytes and arg and not self._omits_body:
            self.sent += len(arg)  # a chunk in the middle of a stream (chunked: no Content-Length)
            send_all(self.sock, b"%X\r\n%s\r\n" % (len(arg), arg))
            return
        if (
            (self.headers_sent and not last)
            or not (kind is bytes or kind is LastChunk)
            or not arg
            or self._omits_body
            or (self.response_length is not None and len(arg) > self.response_length)
        ):
            original_write(self, arg)
            return
        head = b""
        if not self.headers_sent:
            lines = self.default_headers()
            lines.extend("%s: %s\r\n" % (name, value) for name, value in self.headers)  # noqa: UP031 - gunicorn's
            head = ("%s\r\n" % "".join(lines)).encode("latin-1")  # noqa: UP031
            self.headers_sent = True
        self.sent += len(arg)
        if last:
            self._ezat_ended = True
            send_all(self.sock, b"%s%X\r\n%s\r\n0\r\n\r\n" % (head, len(arg), arg))
        elif self.chunked:
            send_all(self.sock, b"%s%X\r\n%s\r\n" % (head, len(arg), arg))
        else:
            send_all(self.sock, head + arg)

    def close(self: Any) -> None:
        if not getattr(self, "_ezat_ended", False):  # the chunked body's end went with its last bytes
            original_close(self)

    response_class.write = write
    response_class.close = close
    response_class._ezat_one_send = True
    return True
