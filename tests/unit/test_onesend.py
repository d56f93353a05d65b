"""A response's head and its first body bytes in one send: the same bytes on the wire as
gunicorn's own ``Response``, one send fewer, for every kind of response gunicorn frames."""

from __future__ import annotations

from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.http import wsgi

from ezat_compat import onesend
from ezat_compat.onesend import LastChunk


class Sock:
    """Records each send; ``send`` takes at most ``room`` bytes (a full socket buffer)."""

    def __init__(self, room: int | None = None) -> None:
        self.sends: list[bytes] = []
        self.room = room

    def send(self, data: bytes) -> int:
        taken = bytes(data[: self.room] if self.room is not None else data)
        self.sends.append(taken)
        return len(taken)

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))


class Req:
    def __init__(self, method: str, version: tuple[int, int] = (1, 1)) -> None:
        self.method = method
        self.version = version
        self.headers: list[tuple[str, str]] = []

    def should_close(self) -> bool:
        return False


CASES: list[tuple[str, str, str, list[tuple[str, str]], list[bytes], int]] = [
    # (case, method, status, headers, body writes, sends saved)
    ("stream", "POST", "200 OK", [("Content-Type", "text/event-stream")], [b"data: 1\n\n", b"data: 2\n\n"], 1),
    ("sized", "POST", "200 OK", [("Content-Length", "7")], [b'{"a":1}'], 1),
    ("sized-in-pieces", "POST", "200 OK", [("Content-Length", "4")], [b"ab", b"cd"], 1),
    ("shorter-length", "POST", "200 OK", [("Content-Length", "2")], [b"abcd"], 0),  # gunicorn's own
    ("empty-first-write", "POST", "200 OK", [("Content-Type", "text/plain")], [b"", b"x"], 0),  # gunicorn's own
    ("no-body-status", "POST", "204 No Content", [], [b""], 0),
    ("head-request", "HEAD", "200 OK", [("Content-Length", "5")], [b"hello"], 0),
    ("http-1.0", "POST", "200 OK", [("Content-Type", "text/plain")], [b"abc"], 1),
    # a stream's last write carries the end of the chunked body
    ("stream-end", "POST", "200 OK", [("Content-Type", "text/event-stream")], [b"a", LastChunk(b"b")], 2),
    ("stream-in-one", "POST", "200 OK", [("Content-Type", "text/event-stream")], [LastChunk(b"all")], 2),
    ("sized-last", "POST", "200 OK", [("Content-Length", "3")], [LastChunk(b"abc")], 1),  # not chunked
]


def wire(
    method: str, status: str, headers: list[tuple[str, str]], writes: list[bytes], room: int | None = None
) -> list[bytes]:
    sock = Sock(room)
    version = (1, 0) if headers == [("Content-Type", "text/plain")] and writes == [b"abc"] else (1, 1)
    response = wsgi.Response(Req(method, version), sock, Config())
    response.start_response(status, list(headers))
    for data in writes:
        response.write(data)
    response.close()
    return sock.sends


@pytest.mark.parametrize(("case", "method", "status", "headers", "writes", "saved"), CASES, ids=[c[0] for c in CASES])
def test_the_same_bytes_with_the_head_in_the_first_body_send(
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    method: str,
    status: str,
    headers: list[tuple[str, str]],
    writes: list[bytes],
    saved: int,
) -> None:
    monkeypatch.setattr(wsgi.util, "http_date", lambda *_: "Tue, 01 Dec 2026 00:00:00 GMT")
    monkeypatch.setattr(wsgi.Response, "write", wsgi.Response.write)  # restored after the test
    monkeypatch.setattr(wsgi.Response, "close", wsgi.Response.close)
    monkeypatch.setattr(wsgi.Response, "_ezat_one_send", False, raising=False)
    before = wire(method, status, headers, writes)
    assert onesend.install()
    after = wire(method, status, headers, writes)
    assert b"".join(after) == b"".join(before)
    assert len(after) == len(before) - saved
    if saved:
        assert after[0].startswith(before[0]) and len(after[0]) > len(before[0])  # the head, then body bytes


@pytest.mark.parametrize("room", [1, 5])
def test_what_a_full_socket_buffer_leaves_goes_with_sendall(monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    monkeypatch.setattr(wsgi.util, "http_date", lambda *_: "Tue, 01 Dec 2026 00:00:00 GMT")
    monkeypatch.setattr(wsgi.Response, "write", wsgi.Response.write)
    monkeypatch.setattr(wsgi.Response, "close", wsgi.Response.close)
    monkeypatch.setattr(wsgi.Response, "_ezat_one_send", False, raising=False)
    writes = [b"data: 1\n\n", b"data: 2\n\n", LastChunk(b"data: [DONE]\n\n")]
    headers = [("Content-Type", "text/event-stream")]
    before = wire("POST", "200 OK", headers, writes)
    assert onesend.install()
    after = wire("POST", "200 OK", headers, writes, room=room)
    assert b"".join(after) == b"".join(before)
    assert len(after) == 2 * len(writes)  # each write: one send, then the rest with sendall


def test_the_date_field_is_formatted_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn import util

    calls: list[float] = []

    def http_date(timestamp: float | None = None) -> str:
        calls.append(timestamp if timestamp is not None else -1.0)
        return str(util.http_date(timestamp))

    cached = onesend.once_a_second(http_date)
    now = [1_796_083_200.25]
    monkeypatch.setattr(onesend.time, "time", lambda: now[0])
    first = cached()
    now[0] = 1_796_083_200.75
    assert cached() == first == "Tue, 01 Dec 2026 00:00:00 GMT" and len(calls) == 1
    now[0] = 1_796_083_201.0
    assert cached() == "Tue, 01 Dec 2026 00:00:01 GMT" and len(calls) == 2
    assert cached(0.0) == "Thu, 01 Jan 1970 00:00:00 GMT"  # an explicit time: formatted as asked


def test_install_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wsgi.Response, "write", wsgi.Response.write)
    monkeypatch.setattr(wsgi.Response, "close", wsgi.Response.close)
    monkeypatch.setattr(wsgi.Response, "_ezat_one_send", False, raising=False)
    assert onesend.install()
    patched: Any = wsgi.Response.write
    assert onesend.install() and wsgi.Response.write is patched
