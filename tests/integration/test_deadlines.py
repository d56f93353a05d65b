"""Deadlines that keep a worker free: request bodies read under a deadline (408, connection
closed), slow-body floods that can't take the worker's connections, and a stream's first-event
deadline with failover. Real gunicorn (gevent), real sockets, loopback only, every wait bounded.

Each test runs on SQLite and on PostgreSQL (a fresh schema).
"""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest
import requests

from tests.integration.harness import Gateway, ModelSpec, Sim
from tests.support.stacks import postgres_schema

pytestmark = pytest.mark.integration

MODEL = "anthropic/claude-haiku-4-5"  # on the healthy simulator only
FAILOVER_MODEL = "anthropic/claude-sonnet-5-5"  # the silent simulator first, the healthy one next
CHAT = "/openai/v1/chat/completions"
MESSAGES = "/v1/messages"
GRACE_S = 2.0
COOLDOWN_S = 3.0
WORKER_CONNECTIONS = 2000  # a quarter of the default 2 workers x 4,000
SLOW_BODIES = 2000  # as many as the worker holds: 8,000 on 8,000 at full scale, here at a quarter of it
STACKS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _database_url(kind: str, request: pytest.FixtureRequest, root: Path, cleanup: ExitStack) -> str:
    if kind == "sqlite":
        return f"sqlite:///{(root / 'ezat.db').as_posix()}"
    return postgres_schema(cleanup, request.getfixturevalue("postgres_url"), "ezat_dl")


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Sim]]:
    """One worker of 2,000 connections with a 2 s body grace,
    in front of a healthy simulator and one that accepts streams but sends nothing for 60 s."""
    kind: str = request.param
    root = tmp_path_factory.mktemp(f"deadlines-{kind}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3 * SLOW_BODIES:  # this process and the gateway (it inherits the limit) hold a socket each
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * SLOW_BODIES), hard))
    with ExitStack() as cleanup:
        healthy = Sim(name="sim-ok").start()
        cleanup.callback(healthy.stop)
        silent = Sim(name="sim-silent", flags=("--latency-ms", "60000")).start()
        cleanup.callback(silent.stop)
        database_url = _database_url(kind, request, root, cleanup)
        models = [
            ModelSpec(
                deployments=[
                    {"name": "silent", "base_url": silent.url, "priority": 0},
                    {"name": "healthy", "base_url": healthy.url, "priority": 1},
                ]
            ),
            ModelSpec(id=MODEL, aliases=("claude-haiku-4-5",), deployments=[{"name": "ok", "base_url": healthy.url}]),
        ]
        gateway = Gateway(
            root=root,
            models=models,
            workers=1,
            gateway_settings={
                "database_url": database_url,
                "first_event_timeout_s": 1.5,
                "cooldown_failures": 1,
                "cooldown_s": COOLDOWN_S,
            },
            server_settings={"worker_connections": WORKER_CONNECTIONS, "body_grace_s": GRACE_S},
            env={"EZAT_DATABASE_URL": database_url, "EZAT_REDIS_URL": ""},
        )
        cleanup.callback(gateway.stop)
        gateway.start()
        yield gateway, healthy


@pytest.fixture(scope="module")
def key(stack: tuple[Gateway, Sim]) -> str:
    return stack[0].new_key("acme")


def _port(gateway: Gateway) -> int:
    return int(gateway.url.rsplit(":", 1)[1])


def _slow_request(port: int, key: str, path: str, sent: bytes = b'{"model": "', length: int = 1000) -> socket.socket:
    """A connection that sends its headers and the first bytes of a ``length``-byte body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: {key}\r\nanthropic-version: 2023-06-01\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + sent)
    return sock


def _read_response(sock: socket.socket, timeout_s: float) -> tuple[bytes, bytes, bool]:
    """(head, body, closed): the response, and whether the server closed the connection after it."""
    sock.settimeout(timeout_s)
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\r\n\r\n" not in data and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    closed = False
    with suppress(OSError):
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        closed = sock.recv(1) == b""
    return head, body, closed


# ---------------------------------------------------------------- slow bodies


@pytest.mark.parametrize(
    ("path", "envelope"),
    [
        pytest.param(CHAT, {"message", "type", "param", "code"}, id="openai"),
        pytest.param(MESSAGES, {"type", "message"}, id="anthropic"),
    ],
)
def test_a_body_that_stops_is_answered_408_and_its_connection_closed(
    stack: tuple[Gateway, Sim], key: str, path: str, envelope: set[str]
) -> None:
    gateway, _ = stack
    started = time.monotonic()
    sock = _slow_request(_port(gateway), key, path)
    try:
        head, body, closed = _read_response(sock, timeout_s=GRACE_S + 8)
    finally:
        sock.close()
    elapsed = time.monotonic() - started
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert closed, "the server must close the connection after the 408"
    assert GRACE_S - 0.2 <= elapsed <= GRACE_S + 3, elapsed
    error = json.loads(body)["error"]
    assert set(error) == envelope
    if path == CHAT:
        assert (error["type"], error["code"]) == ("invalid_request_error", "request_timeout")
    else:
        assert error["type"] == "timeout_error" and json.loads(body)["type"] == "error"
    assert error["message"].startswith("The request body of 1000 bytes did not arrive in time: ")


def test_a_body_that_trickles_in_time_is_served(stack: tuple[Gateway, Sim], key: str) -> None:
    gateway, _ = stack
    payload = json.dumps({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sock = _slow_request(_port(gateway), key, CHAT, sent=payload[:10], length=len(payload))
    try:
        time.sleep(GRACE_S / 2)  # inside the grace: still waited for
        sock.sendall(payload[10:])
        head, body, _ = _read_response(sock, timeout_s=10)
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 200 "), (head, body)


@pytest.fixture(scope="module")
def flood_gateway(stack: tuple[Gateway, Sim], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One worker of 2,000 connections whose bodies may take 60 s: only the eviction of the
    oldest slow bodies can make room within the test."""
    gateway = Gateway(
        root=tmp_path_factory.mktemp("flood"),
        models=[
            ModelSpec(id=MODEL, aliases=("claude-haiku-4-5",), deployments=[{"name": "ok", "base_url": stack[1].url}])
        ],
        workers=1,
        server_settings={"worker_connections": WORKER_CONNECTIONS, "body_grace_s": 60.0},
        env={"EZAT_REDIS_URL": ""},
    ).start()
    yield gateway
    gateway.stop()


def _absorbed(gateway: Gateway, timeout_s: float = 20) -> float:
    """Wait (bounded) until the worker has taken in a burst of connections: /healthz answers."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with suppress(requests.RequestException):
            if requests.get(gateway.url + "/healthz", timeout=1, headers={"connection": "close"}).status_code == 200:
                break
    return time.monotonic() - started


def test_2000_slow_bodies_leave_other_clients_answered_within_a_second(
    stack: tuple[Gateway, Sim], flood_gateway: Gateway
) -> None:
    """As many stalled bodies as the worker has connections, each with a valid key (8,000
    on 2 x 4,000 at full scale): other clients' requests still answer within 1 s, as the oldest
    slow bodies make room, and well before any body deadline."""
    gateway = flood_gateway
    key = gateway.new_key("acme")
    other = gateway.new_key("other-org")
    port = _port(gateway)
    slow: list[socket.socket] = []
    latencies: list[float] = []
    try:
        for _ in range(SLOW_BODIES):
            slow.append(_slow_request(port, key, CHAT))
        absorbed = _absorbed(gateway)
        for _ in range(5):
            t0 = time.monotonic()
            resp = requests.post(
                gateway.url + CHAT,
                json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {other}", "connection": "close"},
                timeout=10,
            )
            latencies.append(time.monotonic() - t0)
            assert resp.status_code == 200, resp.text
    finally:
        for sock in slow:
            sock.close()
    print(
        f"{SLOW_BODIES} stalled bodies taken in after {absorbed:.1f} s; "
        f"probe latencies {', '.join(f'{s:.3f}' for s in latencies)} s"
    )
    assert max(latencies) < 1.0, latencies


# ---------------------------------------------------------------- the first-event deadline of streams


def _stream(gateway: Gateway, key: str, path: str) -> requests.Response:
    body = {"model": FAILOVER_MODEL, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    return requests.post(gateway.url + path, json=body, headers=headers, timeout=20)


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_a_stream_that_sends_no_first_event_fails_over_before_the_client_sees_a_byte(
    stack: tuple[Gateway, Sim], key: str, path: str
) -> None:
    """The first deployment accepts the connection and stays silent for 60 s; after the 1.5 s
    first-event deadline the request goes to the healthy one, and the silent one cools."""
    gateway, healthy = stack
    healthy.clear()
    time.sleep(COOLDOWN_S + 0.1)  # an earlier test may have cooled the silent deployment
    started = time.monotonic()
    resp = _stream(gateway, key, path)
    elapsed = time.monotonic() - started
    assert resp.status_code == 200, resp.text
    assert resp.text.rstrip().endswith("data: [DONE]" if path == CHAT else '"type":"message_stop"}'), resp.text
    assert 1.3 <= elapsed < 10, elapsed
    assert healthy.stats()["streams_completed"] == 1
    # The silent deployment cooled (cooldown_failures = 1): the next stream goes straight to the healthy one.
    started = time.monotonic()
    again = _stream(gateway, key, path)
    assert again.status_code == 200 and time.monotonic() - started < 1.3
    rows = [r for r in gateway.usage() if r["request_id"] == resp.headers["request-id"]]
    assert [r["deployment"] for r in rows] == ["healthy"] and rows[0]["status"] == 200
