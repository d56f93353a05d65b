"""The HTTP/1.1 transport of the upstream calls: keep-alive connections per origin, a request
in one write, a response read straight from the socket.

RFC 9112 (HTTP/1.1), the parts an upstream API answer uses: a status line and header fields
ending with an empty line (section 2.1); a body delimited by ``Transfer-Encoding: chunked``
(7.1), else by ``Content-Length`` (6.2), else by the close of the connection (6.3); none for
1xx, 204 and 304 answers (6.3); a connection kept open unless the answer says
``Connection: close`` or is HTTP/1.0 without ``keep-alive`` (9.3). An idle connection the
server closed is found before reuse (readable while idle: its close or stray bytes) and dropped.

Why not urllib3 here: on this path its own layer (``Timeout`` objects, the pool queue,
``http.client``'s header parsing through the ``email`` package, the response wrapper) cost
0.70 ms of CPU per call against 0.14 ms for this module, measured in one process against the
simulator (bench/RESULTS.md). The image downloader keeps ``requests``.

Errors: ``ConnectFailed`` (the connection could not be made: refused, unreachable, DNS, TLS
handshake; ``timed_out`` when the connect timeout ran out), ``TimeoutError`` (no bytes within
the read timeout: the read may be retried, nothing is lost), ``ProtocolError`` (the answer is
not HTTP/1.1), ``OSError`` (the connection broke). A timeout leaves the response readable: the
chunked decoder keeps its state between reads.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ezat_compat.netio import send_all

MAX_HEAD = 64 * 1024  # bytes of status line and header fields
MAX_CHUNK_LINE = 4096  # bytes of a chunk-size line (RFC 9112, 7.1: size and extensions)
READ_SIZE = 64 * 1024
_ILLEGAL_VALUE = re.compile(r"[\r\n\0]|^\s|\s$")  # what http.client refuses in a field value
_ILLEGAL_NAME = re.compile(r"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")  # RFC 9110, 5.1: a token

try:  # the select of the system even when gevent patched the module: a zero timeout never waits
    from gevent.monkey import get_original

    _select: Any = get_original("select", "select")
except ImportError:  # pragma: no cover - gevent is a dependency
    _select = select.select


class ConnectFailed(OSError):
    """The connection could not be made (``timed_out``: the connect timeout ran out)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 as RFC 9112 frames it."""


def request_head(method: str, target: str, host: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and header fields, ``Host`` first and ``Content-Length`` last (RFC 9112,
    3.2 and 6.2). A field that would split the head (CR, LF, NUL) is refused, as ``http.client``
    refuses it."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if _ILLEGAL_NAME.search(name) or _ILLEGAL_VALUE.search(value):
            raise ValueError(f"invalid header {name!r}")
        lines.append(f"{name}: {value}")
    lines.append(f"content-length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


def parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    """(status, version, fields) of a response head without its final empty line. Field names
    in lower case; a repeated field's values joined with ``", "`` (RFC 9110, 5.3)."""
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise ProtocolError(f"not a header field: {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return int(status_line[1]), status_line[0].decode("latin-1"), fields


class Connection:
    """One connection to an origin; ``buffer`` holds bytes read but not yet consumed."""

    __slots__ = ("buffer", "sock", "timeout")

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.timeout = timeout

    def set_timeout(self, seconds: float | None) -> None:
        if seconds != self.timeout:
            self.sock.settimeout(seconds)
            self.timeout = seconds

    def fill(self) -> None:
        """Read once more onto the buffer; EOF is an ``OSError`` (the caller knows when the
        end of the connection is the end of a body)."""
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self.buffer += data

    def dropped(self) -> bool:
        """An idle connection the server closed (or sent stray bytes on) is not reused."""
        if self.buffer:
            return True
        try:
            readable, _, _ = _select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Response:
    """An answer's status and fields; its body through ``read`` (whatever is decodable now,
    after at most one socket read), ``b""`` at its end. ``release`` gives a connection read to
    the end back to its origin, ``close`` drops it."""

    __slots__ = (
        "_chunk_left",
        "_conn",
        "_length_left",
        "_mode",
        "_origin",
        "_reusable",
        "_zlib",
        "done",
        "headers",
        "status",
    )

    def __init__(self, origin: Origin, conn: Connection, status: int, version: str, headers: dict[str, str]) -> None:
        self._origin = origin
        self._conn: Connection | None = conn
        self.status = status
        self.headers = headers
        self.done = False
        self._chunk_left = -1  # chunked: bytes of the current chunk still to come; -1 before a size line
        self._length_left = 0
        self._zlib: Any = None
        connection = headers.get("connection", "").lower()
        self._reusable = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        encoding = headers.get("content-encoding", "").lower()
        if encoding in ("gzip", "deflate"):  # never asked for (accept-encoding: identity); read if sent
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        if status < 200 or status in (204, 304):
            self._mode, self.done = "none", True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._mode = "chunked"
        elif "content-length" in headers:
            try:
                self._length_left = int(headers["content-length"])
            except ValueError:
                raise ProtocolError("a Content-Length that is not a number") from None
            if self._length_left < 0:
                raise ProtocolError("a negative Content-Length")
            self._mode, self.done = "length", self._length_left == 0
        else:
            self._mode, self._reusable = "close", False

    def set_timeout(self, seconds: float | None) -> None:
        if self._conn is not None:
            self._conn.set_timeout(seconds)

    def read(self) -> bytes:
        """The body bytes decodable now (one socket read when none are), ``b""`` at the end.
        Raises ``TimeoutError`` when no bytes came within the read timeout (nothing is lost:
        read again), ``OSError`` when the connection broke, ``ProtocolError`` on a bad frame."""
        if self.done:
            return b""
        conn = self._conn
        if conn is None:
            raise ConnectionResetError("the response was closed")
        if self._mode == "chunked":
            data = self._dechunk(conn)
        elif self._mode == "length":
            if not conn.buffer:
                conn.fill()
            data = bytes(conn.buffer[: self._length_left])
            del conn.buffer[: len(data)]
            self._length_left -= len(data)
            self.done = self._length_left == 0
        else:  # delimited by the close of the connection
            if not conn.buffer:
                chunk = conn.sock.recv(READ_SIZE)
                if not chunk:
                    self.done = True
                    return self._decoded(b"", final=True)
                conn.buffer += chunk
            data = bytes(conn.buffer)
            conn.buffer.clear()
        return self._decoded(data, final=self.done)

    def _decoded(self, data: bytes, *, final: bool) -> bytes:
        if self._zlib is None:
            return data
        try:
            out: bytes = self._zlib.decompress(data)
            return out + self._zlib.flush() if final else out
        except zlib.error:
            raise ProtocolError("a compressed body that does not decompress") from None

    def _dechunk(self, conn: Connection) -> bytes:
        """The chunk data decodable from the buffer (RFC 9112, 7.1), filling it once when none is."""
        parts: list[bytes] = []
        buffer = conn.buffer
        while True:
            if self._chunk_left < 0:  # a size line
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE:
                        raise ProtocolError("a chunk-size line too long")
                    if parts:
                        break
                    conn.fill()
                    continue
                size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"not a chunk size: {size_text[:20]!r}") from None
                if size < 0:
                    raise ProtocolError("a negative chunk size")
                if size == 0:  # the last chunk: the trailer section ends with an empty line
                    trailer_end = buffer.find(b"\r\n\r\n", end)
                    if trailer_end == end:  # no trailer fields
                        del buffer[: end + 4]
                        self.done = True
                        break
                    if trailer_end < 0:
                        if len(buffer) > MAX_HEAD:
                            raise ProtocolError("a trailer section too long")
                        if parts:
                            break
                        conn.fill()
                        continue
                    del buffer[: trailer_end + 4]
                    self.done = True
                    break
                del buffer[: end + 2]
                self._chunk_left = size
            if self._chunk_left > 0:
                if not buffer:
                    if parts:
                        break
                    conn.fill()
                    continue
                piece = bytes(buffer[: self._chunk_left])
                del buffer[: len(piece)]
                self._chunk_left -= len(piece)
                parts.append(piece)
                if self._chunk_left > 0:
                    break
            if len(buffer) < 2:  # the CRLF after a chunk's data
                if parts:
                    break
                conn.fill()
                continue
            if buffer[:2] != b"\r\n":
                raise ProtocolError("a chunk not followed by CRLF")
            del buffer[:2]
            self._chunk_left = -1
        return b"".join(parts)

    def read_all(self) -> bytes:
        parts = []
        while not self.done:
            parts.append(self.read())
        return b"".join(parts)

    def release(self) -> None:
        """Back to the origin's idle connections if read to its end and reusable, else closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.done and self._reusable and not conn.buffer:
            self._origin.put(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def shutdown(self) -> None:
        """End the connection under a reader waiting on it (another greenlet or thread): its
        read sees the end at once. The connection is then not reused."""
        conn = self._conn
        if conn is not None:
            self._reusable = False
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


class Origin:
    """Keep-alive connections to one scheme, host and port: at most ``max_idle`` kept idle
    (more are opened when all are busy, and closed when they come back)."""

    def __init__(self, base_url: str, *, max_idle: int, ca_file: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_field = host if parts.port is None else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.max_idle = max_idle
        self._idle: deque[Connection] = deque()
        self._context: ssl.SSLContext | None = None
        if self.tls:
            self._context = ssl.create_default_context(cafile=ca_file)
            self._context.set_alpn_protocols(["http/1.1"])

    def connect(self, timeout: float) -> Connection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except TimeoutError:
            raise ConnectFailed(f"timed out connecting to {self.host}:{self.port}", timed_out=True) from None
        except OSError as exc:
            raise ConnectFailed(f"could not connect to {self.host}:{self.port}: {type(exc).__name__}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
        except TimeoutError:
            sock.close()
            raise ConnectFailed(f"timed out in the TLS handshake with {self.host}", timed_out=True) from None
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ConnectFailed(f"TLS with {self.host} failed: {type(exc).__name__}") from None
        return Connection(sock, timeout)

    def get(self, connect_timeout: float) -> tuple[Connection, bool]:
        """An idle connection still open (reused: True), else a new one."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.dropped():
                return conn, True
            conn.close()
        return self.connect(connect_timeout), False

    def put(self, conn: Connection) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> Response:
        """Send one request (head and body in one write) and read its answer's head within
        ``read_timeout`` per socket read. Interim 1xx answers are skipped (RFC 9110, 15.2)."""
        head = request_head(method, self.prefix + path, self.host_field, headers, len(body))
        conn, _reused = self.get(connect_timeout)
        try:
            conn.set_timeout(read_timeout)
            send_all(conn.sock, head + body)
            while True:
                status, version, fields = self._read_head(conn)
                if not 100 <= status < 200 or status == 101:
                    return Response(self, conn, status, version, fields)
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _read_head(conn: Connection) -> tuple[int, str, dict[str, str]]:
        buffer = conn.buffer
        start = 0
        while True:
            end = buffer.find(b"\r\n\r\n", max(start - 3, 0))
            if end >= 0:
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                return parse_head(head)
            if len(buffer) > MAX_HEAD:
                raise ProtocolError("a response head too long")
            start = len(buffer)
            conn.fill()
