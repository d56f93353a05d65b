"""The upstream HTTP/1.1 transport (RFC 9112): response framing, chunked bodies however the
bytes are split, keep-alive rules, a dropped idle connection, a read timeout that loses
nothing, and request heads that can't be split. Real sockets on loopback."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ezat_compat.upstream.transport import Origin, ProtocolError, Response, parse_head, request_head


class Peer:
    """A one-connection-at-a-time server whose answers the test writes byte for byte."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.answers: list[Callable[[socket.socket], None]] = []
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(sock)
            threading.Thread(target=self._connection, args=(sock,), daemon=True).start()

    def _connection(self, sock: socket.socket) -> None:
        try:
            self._answer(sock)
        except OSError:  # the answer closed the connection
            return

    def _answer(self, sock: socket.socket) -> None:
        buffer = b""
        while self.answers:
            while b"\r\n\r\n" not in buffer:
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = int(parse_head(b"HTTP/1.1 200 X\r\n" + head.split(b"\r\n", 1)[1])[2]["content-length"])
            while len(buffer) < length:
                buffer += sock.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + buffer[:length])
            buffer = buffer[length:]
            self.answers.pop(0)(sock)

    def close(self) -> None:
        self.listener.close()
        for sock in self.accepted:
            sock.close()


@pytest.fixture()
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def send(*pieces: bytes, pause: float = 0.0, close: bool = False) -> Callable[[socket.socket], None]:
    def answer(sock: socket.socket) -> None:
        for piece in pieces:
            sock.sendall(piece)
            if pause:
                time.sleep(pause)
        if close:
            sock.shutdown(socket.SHUT_RDWR)

    return answer


def post(origin: Origin, timeout: float = 5) -> Response:
    return origin.request("POST", "/v1/messages", {"x-api-key": "k"}, b"{}", connect_timeout=5, read_timeout=timeout)


CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "wire, body",
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"hello"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),
        (CHUNKED + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", b"hello world"),
        (CHUNKED + b"5;ext=1\r\nhello\r\n0\r\n\r\n", b"hello"),  # a chunk extension (RFC 9112, 7.1.1)
        (CHUNKED + b"A\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n", b"0123456789"),  # a trailer (7.1.2)
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),  # 1xx skipped
    ],
)
def test_bodies_are_framed_as_rfc_9112_says_and_the_connection_is_kept(peer: Peer, wire: bytes, body: bytes) -> None:
    peer.answers = [send(wire), send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")]
    origin = Origin(peer.url, max_idle=4)
    response = post(origin)
    assert response.read_all() == body
    response.release()
    again = post(origin)
    assert again.read_all() == b"ok"
    assert len(peer.accepted) == 1


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_a_chunked_body_split_anywhere_decodes_the_same(peer: Peer, step: int) -> None:
    wire = CHUNKED + b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n1\r\nZ\r\n0\r\n\r\n"
    peer.answers = [send(*(wire[i : i + step] for i in range(0, len(wire), step)), pause=0.001)]
    response = post(Origin(peer.url, max_idle=1))
    assert response.read_all() == b"abc0123456789abcdefZ" and response.done


@pytest.mark.parametrize(
    "wire, reusable",
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", True),
    ],
)
def test_connection_close_and_http_1_0_are_not_reused(peer: Peer, wire: bytes, reusable: bool) -> None:
    peer.answers = [send(wire), send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")]
    origin = Origin(peer.url, max_idle=4)
    response = post(origin)
    response.read_all()
    response.release()
    post(origin).read_all()
    assert len(peer.accepted) == (1 if reusable else 2)


def test_a_body_delimited_by_the_close_is_read_to_the_close(peer: Peer) -> None:
    peer.answers = [send(b"HTTP/1.1 200 OK\r\n\r\nuntil", b" the end", pause=0.01, close=True)]
    response = post(Origin(peer.url, max_idle=1))
    assert response.read_all() == b"until the end"


def test_an_idle_connection_the_server_closed_is_not_reused(peer: Peer) -> None:
    def answer_then_close(sock: socket.socket) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        time.sleep(0.05)
        sock.close()  # the server's keep-alive timeout, with no "connection: close"

    peer.answers = [answer_then_close, send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")]
    origin = Origin(peer.url, max_idle=4)
    response = post(origin)
    response.read_all()
    response.release()
    time.sleep(0.2)
    assert post(origin).read_all() == b"ok"
    assert len(peer.accepted) == 2


def test_a_read_timeout_loses_nothing(peer: Peer) -> None:
    peer.answers = [send(CHUNKED + b"5\r\nhel", b"lo\r\n0\r\n\r\n", pause=0.4)]
    response = post(Origin(peer.url, max_idle=1))
    response.set_timeout(0.1)
    got = response.read()
    with pytest.raises(TimeoutError):
        while True:
            got += response.read()
    response.set_timeout(5)
    assert got + response.read_all() == b"hello"


def test_a_gzip_body_sent_unasked_is_decoded(peer: Peer) -> None:
    packed = gzip.compress(b'{"ok":true}')
    wire = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(packed), packed)
    peer.answers = [send(wire)]
    assert post(Origin(peer.url, max_idle=1)).read_all() == b'{"ok":true}'


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: many\r\n\r\n",
        CHUNKED + b"zz\r\nhello\r\n",
        CHUNKED + b"5\r\nhelloXX0\r\n\r\n",
    ],
)
def test_what_is_not_http_1_1_is_a_protocol_error(peer: Peer, wire: bytes) -> None:
    peer.answers = [send(wire)]
    with pytest.raises(ProtocolError):
        post(Origin(peer.url, max_idle=1)).read_all()


def test_a_body_cut_short_is_a_broken_connection(peer: Peer) -> None:
    peer.answers = [send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf", close=True)]
    with pytest.raises(ConnectionResetError):
        post(Origin(peer.url, max_idle=1)).read_all()


@pytest.mark.parametrize(
    "name, value",
    [("x-api-key", "k\r\nx-injected: 1"), ("x-api-key", "k\n"), ("bad name", "v"), ("x-a", "nul\0")],
)
def test_a_field_that_would_split_the_head_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        request_head("POST", "/v1/messages", "h", {name: value}, 0)


def test_the_head_names_the_host_and_ends_with_the_length() -> None:
    assert request_head("POST", "/p", "h:81", {"a": "1"}, 2) == (
        b"POST /p HTTP/1.1\r\nHost: h:81\r\na: 1\r\ncontent-length: 2\r\n\r\n"
    )


def test_repeated_fields_are_joined_and_names_lowered() -> None:
    status, version, fields = parse_head(b"HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nVia: a\r\nvia: b")
    assert (status, version, fields) == (429, "HTTP/1.1", {"retry-after": "3", "via": "a, b"})


@pytest.mark.parametrize(
    "url, host_field",
    [
        ("http://127.0.0.1:8090", "127.0.0.1:8090"),
        ("https://api.anthropic.com", "api.anthropic.com"),
        ("http://[::1]:9000/base/", "[::1]:9000"),
    ],
)
def test_the_host_field_is_the_url_authority(url: str, host_field: str) -> None:
    assert Origin(url, max_idle=1).host_field == host_field
