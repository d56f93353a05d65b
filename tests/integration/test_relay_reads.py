"""The stream read in place, with no reader of its own (``upstream/client.UpstreamStream``),
against a scripted upstream on loopback (real sockets, plain and TLS; threads, as outside
gevent): ``poll`` returns by its bound while the upstream is silent (the writer's keep-alive is
due), never waits for bytes that have already arrived (held by http.client's buffered reader or
the TLS layer), loses no byte across the waits, breaks a stream silent for the idle timeout,
wakes for ``interrupt``, and gives the connection back when the body's end had arrived."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ezat_compat.domain import Deployment
from ezat_compat.errors import UpstreamStreamError, UpstreamTimeoutError
from ezat_compat.upstream.client import UpstreamClient
from tests.support.tls import self_signed
from tests.support.wire import read_message

pytestmark = pytest.mark.integration

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
START = b'event: message_start\ndata: {"type":"message_start"}\n\n'
STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
END = b"0\r\n\r\n"
SAFETY_S = 5.0  # how long a scripted upstream stays silent at most (a test that hangs fails, not waits)
Script = Callable[[socket.socket, threading.Event], None]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def delta(i: int, size: int = 0) -> bytes:
    text = f"w{i}" + "x" * size
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"' + text.encode() + b'"}}\n\n'
    )


class Upstream:
    """Runs ``script(connection, go)`` for each request (its body read first); ``go`` is set by
    the test when the upstream may go on. Its threads are named, so a test can tell them from
    any the client would start."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.context = context
        self.scripts: list[Script] = []
        self.connections = 0
        self.go = threading.Event()
        threading.Thread(target=self._accept, name="scripted-upstream", daemon=True).start()

    @property
    def url(self) -> str:
        scheme = "https" if self.context else "http"
        return f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), name="scripted-upstream", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            buffer = b""
            while (message := read_message(conn, buffer)) is not None:
                buffer = message[2]
                self.scripts.pop(0)(conn, self.go)
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.go.set()
        self.listener.close()


@pytest.fixture()
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


def deployment(url: str, ca_file: str = "") -> Deployment:
    return Deployment(name="d1", base_url=url, upstream_model="m", api_key="k", ca_file=ca_file)


def client(idle_s: float = 30) -> UpstreamClient:
    return UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=idle_s)


def timed(work: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    out = work()
    return out, time.monotonic() - started


def test_a_silent_upstream_lets_poll_return_by_its_bound(upstream: Upstream) -> None:
    """After a whole event (its chunk's CRLF read with it) the upstream is silent: ``poll``
    returns empty by its bound, so the writer can send its keep-alive, and the event that comes
    later is read whole."""

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START) + chunk(delta(1)))
        go.wait(SAFETY_S)
        conn.sendall(chunk(delta(2)) + chunk(STOP) + END)

    upstream.scripts = [script]
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    first = stream.first()
    assert first is not None and first[0] == "message_start"
    assert [e for e, _ in stream.poll(0.2)] == ["content_block_delta"]
    for _ in range(3):  # three keep-alives' worth of silence
        events, took = timed(lambda: stream.poll(0.2))
        assert events == [] and 0.15 < took < 1.0, took
    upstream.go.set()
    got = [data for _, data in stream.events()]
    assert got[0].endswith('"text":"w2"}}') and got[1] == '{"type":"message_stop"}' and stream.ended
    stream.close()
    up.clear()


def test_an_upstream_silent_inside_an_event_loses_no_byte(upstream: Upstream) -> None:
    """An event that arrives in pieces across many empty polls comes out whole, once."""
    event = delta(7, size=300)
    pieces = [event[:10], event[10:150], event[150:-1], event[-1:]]

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START))
        for piece in pieces:
            go.wait(SAFETY_S)
            go.clear()
            conn.sendall(chunk(piece))
        conn.sendall(chunk(STOP) + END)

    upstream.scripts = [script]
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    assert stream.first() is not None
    got: list[tuple[str, str]] = []
    for _ in pieces:
        upstream.go.set()
        events, took = timed(lambda: stream.poll(0.15))
        got += events  # type: ignore[arg-type]
        assert took < 1.0
    got += list(stream.events())
    assert got == [("content_block_delta", event[len(b"event: content_block_delta\ndata: ") : -2].decode()),
                   ("message_stop", '{"type":"message_stop"}')]  # fmt: skip
    stream.close()
    up.clear()


def test_events_held_by_the_buffered_reader_are_read_without_waiting(upstream: Upstream) -> None:
    """Many small chunks in one write: reading the first pulls the rest into http.client's
    buffered reader, and the socket has nothing left. ``poll`` takes them at once, not after its
    bound (a wait on the socket alone would sleep on bytes already here)."""

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START) + b"".join(chunk(delta(i)) for i in range(20)))
        go.wait(SAFETY_S)
        conn.sendall(chunk(STOP) + END)

    upstream.scripts = [script]
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    assert stream.first() is not None
    events, took = timed(lambda: stream.poll(3.0))
    assert len(events) == 20 and took < 1.0, took  # type: ignore[arg-type]
    upstream.go.set()
    stream.close()
    up.clear()


def test_events_held_by_the_tls_layer_are_read_without_waiting(tmp_path: Path) -> None:
    """Over TLS a record of 12 KB of small chunks is more than the buffered reader takes at once
    (8 KB): the rest waits decrypted in the TLS layer, not on the socket. ``poll`` takes it all
    at once."""
    cert_file, key_file = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    upstream = Upstream(context)
    body = b"".join(chunk(delta(i, size=60)) for i in range(70))
    assert 10_000 < len(body) < 16_000  # one TLS record

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START))
        time.sleep(0.1)
        conn.sendall(body)
        go.wait(SAFETY_S)
        conn.sendall(chunk(STOP) + END)

    upstream.scripts = [script]
    up = client()
    try:
        stream = up.open_stream(
            deployment(upstream.url, ca_file=str(cert_file)), "/v1/messages", b"{}", first_event_timeout_s=5
        )
        assert stream.first() is not None
        got: list[object] = []
        started = time.monotonic()
        while len(got) < 70 and time.monotonic() - started < 1.5:
            got += stream.poll(3.0)
        assert len(got) == 70 and time.monotonic() - started < 1.0
        upstream.go.set()
        assert [e for e, _ in stream.events()] == ["message_stop"]
        stream.close()
    finally:
        up.clear()
        upstream.close()


def test_a_socket_silent_for_the_idle_timeout_breaks_the_stream(upstream: Upstream) -> None:
    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START))
        go.wait(SAFETY_S)

    upstream.scripts = [script]
    up = client(idle_s=0.6)
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=0.5)
    assert stream.first() is not None
    started = time.monotonic()
    with pytest.raises(UpstreamStreamError, match="silent"):
        while time.monotonic() - started < 3:
            assert stream.poll(0.2) == []
    assert 0.4 < time.monotonic() - started < 1.2
    stream.close()
    up.clear()


def test_interrupt_from_another_thread_wakes_a_waiting_poll(upstream: Upstream) -> None:
    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START))
        go.wait(SAFETY_S)

    upstream.scripts = [script]
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    assert stream.first() is not None
    threading.Timer(0.2, stream.interrupt).start()
    events, took = timed(lambda: stream.poll(5.0))
    assert events == [] and took < 1.0, took
    stream.close()
    up.clear()


def test_a_stream_closed_when_its_end_has_arrived_gives_the_connection_back(upstream: Upstream) -> None:
    """The reply's last event, then the body's end a moment later (its own write): the writer
    closes the stream on the last event; the end, there by then, is read, and the connection
    serves the next call."""

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START) + chunk(STOP))
        time.sleep(0.05)
        conn.sendall(END)

    def answer(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    upstream.scripts = [script, answer]
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    assert stream.first() is not None
    assert [e for e, _ in stream.poll(1.0)] == ["message_stop"]
    time.sleep(0.2)
    stream.close()
    assert up.complete(deployment(upstream.url), "/v1/messages", b"{}", timeout_s=5)[0] == b"{}"
    assert upstream.connections == 1
    up.clear()


def test_the_stream_is_read_by_its_callers_alone(upstream: Upstream) -> None:
    """No thread (a greenlet under gevent) reads the stream: the request, its first event and
    the rest are read by whoever calls."""

    def script(conn: socket.socket, go: threading.Event) -> None:
        conn.sendall(HEAD + chunk(START))
        go.wait(SAFETY_S)
        conn.sendall(chunk(STOP) + END)

    upstream.scripts = [script]
    before = set(threading.enumerate())
    up = client()
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=5)
    assert stream.first() is not None
    assert stream.poll(0.1) == []
    started = [t for t in threading.enumerate() if t not in before]
    assert started and all(t.name == "scripted-upstream" for t in started), started
    upstream.go.set()
    assert [e for e, _ in stream.events()] == ["message_stop"]
    stream.close()
    up.clear()


def test_a_head_that_never_comes_is_given_up_at_the_first_event_deadline(upstream: Upstream) -> None:
    """Outside gevent no wall-clock bound holds the send: the head's read timeout is the first
    event's, not the idle timeout."""
    upstream.scripts = [lambda conn, go: go.wait(SAFETY_S)]
    up = client(idle_s=30)
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError):
        stream.first()
    assert time.monotonic() - started < 1.5
    stream.close()
    up.clear()


def test_a_first_event_that_never_comes_is_given_up_at_the_deadline_not_a_read_timeout_later(
    upstream: Upstream,
) -> None:
    """The head comes late, then nothing: outside gevent the first read waits for what is left
    of the deadline, not for a whole first-event timeout more."""

    def script(conn: socket.socket, go: threading.Event) -> None:
        time.sleep(0.7)
        conn.sendall(HEAD)
        go.wait(SAFETY_S)

    upstream.scripts = [script]
    up = client(idle_s=30)
    stream = up.open_stream(deployment(upstream.url), "/v1/messages", b"{}", first_event_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError):
        stream.first()
    assert 0.9 < time.monotonic() - started < 1.45
    stream.close()
    up.clear()
