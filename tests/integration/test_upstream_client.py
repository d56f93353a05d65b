"""The upstream client's connection handling, against a scripted HTTP server on loopback (real
sockets for protocol edges: refused connections, timeouts, a stream cut mid-way, connection
reuse, TLS). The exception map and the egress settings in process: test_upstream_requests.py."""

from __future__ import annotations

import functools
import gzip
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ezat_compat.domain import Deployment
from ezat_compat.errors import (
    UpstreamBodyError,
    UpstreamConnectError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
    UpstreamTLSError,
)
from ezat_compat.upstream.bodies import encode_body, with_model
from ezat_compat.upstream.client import UpstreamClient
from tests.support.tls import self_signed
from tests.support.wire import read_message

pytestmark = pytest.mark.integration

Script = Callable[[socket.socket, bytes], None]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: ScriptedServer = self.server  # type: ignore[assignment]
        server.connections += 1
        sock: socket.socket = self.request
        buffer = b""
        while (message := read_message(sock, buffer)) is not None:
            head, body, buffer = message
            server.requests.append(head + b"\r\n\r\n" + body)
            script = server.scripts.pop(0)
            try:
                script(sock, body)
            except OSError:
                return
            if server.close_after:
                return


class ScriptedServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scripts: list[Script] = []
        self.requests: list[bytes] = []
        self.connections = 0
        self.close_after = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def respond(status: int, body: bytes, headers: str = "") -> Script:
    def script(sock: socket.socket, _: bytes) -> None:
        sock.sendall(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{headers}\r\n".encode()
            + body
        )

    return script


def chunked(*events: bytes, end: bool = True) -> Script:
    def script(sock: socket.socket, _: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            sock.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        if end:
            sock.sendall(b"0\r\n\r\n")
        else:
            sock.shutdown(socket.SHUT_RDWR)

    return script


@pytest.fixture()
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def deployment(url: str) -> Deployment:
    return Deployment(name="d1", base_url=url, upstream_model="claude-x", api_key="sk-up")


@pytest.fixture()
def client() -> Iterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=5)
    yield c
    c.clear()


def test_complete_sends_the_deployments_key_and_reuses_the_connection(
    server: ScriptedServer, client: UpstreamClient
) -> None:
    server.scripts = [respond(200, b'{"ok":1}'), respond(200, b'{"ok":2}')]
    body = with_model(encode_body({"max_tokens": 5}), "claude-x", stream=False)
    assert client.complete(deployment(server.url), "/v1/messages", body, timeout_s=5)[0] == b'{"ok":1}'
    assert client.complete(deployment(server.url), "/v1/messages", body, timeout_s=5)[0] == b'{"ok":2}'
    assert server.connections == 1
    request = server.requests[0].lower()
    assert b"x-api-key: sk-up" in request and b"anthropic-version: 2023-06-01" in request
    assert server.requests[0].endswith(b'{"model":"claude-x","stream":false,"max_tokens":5}')


def test_a_kept_connection_the_server_closed_is_not_used_again(server: ScriptedServer, client: UpstreamClient) -> None:
    """Before reusing a kept connection the pool asks whether it has something to read (the
    server's end): this one has, so the next call opens another (a reused closed connection
    would fail the call: no retries)."""
    server.close_after = True
    server.scripts = [respond(200, b'{"ok":1}'), respond(200, b'{"ok":2}')]
    assert client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)[0] == b'{"ok":1}'
    time.sleep(0.2)  # the server's end has reached us
    assert client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)[0] == b'{"ok":2}'
    assert server.connections == 2


@pytest.mark.parametrize(
    "status, failover",
    [
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (529, True),
        (401, True),
        (403, True),
        (404, True),
        (400, False),
        (413, False),
        (422, False),
    ],
)
def test_status_errors_and_failover(
    server: ScriptedServer, client: UpstreamClient, status: int, failover: bool
) -> None:
    body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    server.scripts = [respond(status, body, "Retry-After: 7\r\n")]
    with pytest.raises(UpstreamStatusError) as info:
        client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    err = info.value
    assert (err.status_code, err.failover, err.upstream_retry_after, err.error_type, err.message) == (
        status,
        failover,
        7.0,
        "overloaded_error",
        "Overloaded",
    )


def test_connection_refused_fails_over(client: UpstreamClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound but not listening: refused
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(UpstreamConnectError) as info:
            client.complete(deployment(url), "/v1/messages", b"{}", timeout_s=5)
    assert info.value.failover


def test_no_answer_in_time_is_a_timeout(server: ScriptedServer, client: UpstreamClient) -> None:
    server.scripts = [lambda sock, _: time.sleep(2)]
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError) as info:
        client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=0.5)
    assert info.value.failover and time.monotonic() - started < 1.5


def test_a_drip_past_the_deadline_is_a_timeout(server: ScriptedServer, client: UpstreamClient) -> None:
    def drip(sock: socket.socket, _: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        for _ in range(100):
            sock.sendall(b" ")
            time.sleep(0.05)

    server.scripts = [drip]
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError):
        client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=1)
    assert time.monotonic() - started < 2  # wall clock, not a per-read timeout


def test_a_chunked_json_answer_is_read_whole(server: ScriptedServer, client: UpstreamClient) -> None:
    server.scripts = [chunked(b'{"content":', b' [], "usage": {}}')]
    data, _ = client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    assert data == b'{"content": [], "usage": {}}'


def test_a_complete_stream_gives_its_events_and_its_connection_back(
    server: ScriptedServer, client: UpstreamClient
) -> None:
    events = [
        b'event: message_start\ndata: {"a":1}\n\n',
        b"event: ping\r\ndata: {}\r\n\r\n",
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    server.scripts = [chunked(*events), respond(200, b"{}")]
    stream = client.open_stream(deployment(server.url), "/v1/messages", b"{}")
    assert [e for e, _ in stream.events()] == ["message_start", "ping", "message_stop"]
    stream.close()
    client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    assert server.connections == 1
    assert b"accept: text/event-stream" in server.requests[0].lower()


def test_a_stream_cut_mid_way_is_a_stream_error(server: ScriptedServer, client: UpstreamClient) -> None:
    server.scripts = [chunked(b"event: message_start\ndata: {}\n\n", end=False)]
    server.close_after = True
    stream = client.open_stream(deployment(server.url), "/v1/messages", b"{}")
    events = stream.events()
    assert next(events)[0] == "message_start"
    with pytest.raises(UpstreamStreamError) as info:
        list(events)
    assert not info.value.failover
    stream.close()


def test_closing_a_stream_early_drops_its_connection(server: ScriptedServer, client: UpstreamClient) -> None:
    def slow(sock: socket.socket, body: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in (b"event: message_start\ndata: {}\n\n", b"event: ping\ndata: {}\n\n"):
            sock.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            time.sleep(0.3)
        sock.sendall(b"0\r\n\r\n")

    server.scripts = [slow, respond(200, b"{}")]
    stream = client.open_stream(deployment(server.url), "/v1/messages", b"{}")
    next(stream.events())
    stream.close()  # the body is not read to its end: the connection can't be reused
    client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    assert server.connections == 2


@pytest.mark.parametrize(
    "body, model, stream, expected",
    [
        (b'{"a":1}', "m", None, b'{"model":"m","a":1}'),
        (b"{}", "m", True, b'{"model":"m","stream":true}'),
        (b'{"a":"\\u00e9"}', 'x"y', False, b'{"model":"x\\"y","stream":false,"a":"\\u00e9"}'),
    ],
)
def test_with_model_splices_without_reserialising(
    body: bytes, model: str, stream: bool | None, expected: bytes
) -> None:
    assert with_model(body, model, stream=stream) == expected


def test_the_path_of_the_deployment_url_prefixes_the_request(server: ScriptedServer, client: UpstreamClient) -> None:
    server.scripts = [respond(200, b"{}")]
    client.complete(deployment(server.url + "/anthropic/"), "/v1/messages", b"{}", timeout_s=5)
    assert server.requests[0].startswith(b"POST /anthropic/v1/messages HTTP/1.1\r\n")


def test_the_tls_connection_is_verified_and_kept_alive(server: ScriptedServer, tmp_path: Path) -> None:
    cert_file, key_file = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.scripts = [respond(200, b'{"ok":1}'), respond(200, b'{"ok":2}')]
    url = f"https://127.0.0.1:{server.server_address[1]}"
    client = UpstreamClient(connect_timeout_s=5, stream_idle_timeout_s=5)
    trusted = Deployment(name="tls", base_url=url, upstream_model="m", api_key="k", ca_file=str(cert_file))
    for n in (1, 2):
        data, _ = client.complete(trusted, "/v1/messages", b'{"max_tokens":5}', timeout_s=5)
        assert data == b'{"ok":%d}' % n
    assert server.connections == 1 and all(r.endswith(b'\r\n\r\n{"max_tokens":5}') for r in server.requests)
    client.clear()
    untrusted = Deployment(name="tls", base_url=url, upstream_model="m", api_key="k")  # certifi doesn't know it
    with pytest.raises(UpstreamTLSError) as info:
        UpstreamClient(connect_timeout_s=5, stream_idle_timeout_s=5).complete(
            untrusted, "/v1/messages", b"{}", timeout_s=5
        )
    assert info.value.certificate and info.value.failover
    assert "certificate verify failed" in info.value.message


def test_a_stream_that_drips_bytes_but_no_event_times_out_by_the_wall_clock(
    server: ScriptedServer, client: UpstreamClient
) -> None:
    def drip(sock: socket.socket, _: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(60):  # an SSE comment a byte at a time: bytes keep coming, no event ever completes
            for byte in b": still here\n":
                sock.sendall(b"1\r\n" + bytes([byte]) + b"\r\n")
                time.sleep(0.02)

    server.scripts = [drip]
    started = time.monotonic()
    stream = client.open_stream(deployment(server.url), "/v1/messages", b"{}", first_event_timeout_s=1)
    with pytest.raises(UpstreamTimeoutError):
        next(iter(stream.events()))
    assert time.monotonic() - started < 2  # the deadline, not a timeout per read
    stream.close()


# ---------------------------------------------------------------- a hostile upstream


def _capped() -> UpstreamClient:
    return UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=5, max_body_bytes=1000)


def _endless_length(sock: socket.socket, _: bytes) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2000000000\r\n\r\n")
    for _ in range(200):  # 6.4 MB offered, far past the cap: the client must stop reading
        sock.sendall(b"x" * 32768)


def _endless_chunks(sock: socket.socket, _: bytes) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    for _ in range(200):
        sock.sendall(b"8000\r\n" + b"x" * 32768 + b"\r\n")


def _until_close(sock: socket.socket, _: bytes) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
    for _ in range(200):
        sock.sendall(b"x" * 32768)


@pytest.mark.parametrize("script", [_endless_length, _endless_chunks, _until_close], ids=["length", "chunked", "close"])
def test_a_body_over_the_cap_is_refused_and_fails_over(server: ScriptedServer, script: Script) -> None:
    server.scripts = [script]
    client = _capped()
    started = time.monotonic()
    with pytest.raises(UpstreamBodyError) as info:
        client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    assert info.value.failover and time.monotonic() - started < 2
    client.clear()


def test_a_body_at_the_cap_is_taken(server: ScriptedServer) -> None:
    server.scripts = [respond(200, b'{"a":"' + b"x" * 992 + b'"}')]
    client = _capped()
    assert len(client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)[0]) == 1000
    client.clear()


@functools.cache
def gzip_bomb() -> bytes:
    """10 KB that decode to 10 MB (made at first use, not at collection)."""
    return gzip.compress(b" " * 10_000_000)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP"])
def test_an_encoding_we_did_not_ask_for_is_refused(
    server: ScriptedServer, client: UpstreamClient, encoding: str
) -> None:
    server.scripts = [respond(200, gzip_bomb(), f"content-encoding: {encoding}\r\n")]
    with pytest.raises(UpstreamBodyError) as info:
        client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)
    assert info.value.failover
    assert b"accept-encoding: identity" in server.requests[0].lower()


def test_a_stream_in_an_encoding_we_did_not_ask_for_is_refused(server: ScriptedServer, client: UpstreamClient) -> None:
    bomb = gzip_bomb()

    def script(sock: socket.socket, _: bytes) -> None:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + f"{len(bomb):x}\r\n".encode() + bomb + b"\r\n0\r\n\r\n"
        )

    server.scripts = [script]
    stream = client.open_stream(deployment(server.url), "/v1/messages", b"{}", first_event_timeout_s=2)
    with pytest.raises(UpstreamBodyError):
        stream.first()
    stream.close()


def test_an_identity_encoding_is_taken(server: ScriptedServer, client: UpstreamClient) -> None:
    server.scripts = [respond(200, b'{"ok":1}', "content-encoding: identity\r\n")]
    assert client.complete(deployment(server.url), "/v1/messages", b"{}", timeout_s=5)[0] == b'{"ok":1}'
