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
    def __init__(self) -> None:
        self.sends: list[bytes] = []

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


def wire(method: str, status: str, headers: list[tuple[str, str]], writes: list[bytes]) -> list[bytes]:
    sock = Sock()
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


def test_install_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wsgi.Response, "write", wsgi.Response.write)
    monkeypatch.setattr(wsgi.Response, "close", wsgi.Response.close)
    monkeypatch.setattr(wsgi.Response, "_ezat_one_send", False, raising=False)
    assert onesend.install()
    patched: Any = wsgi.Response.write
    assert onesend.install() and wsgi.Response.write is patched
