"""The proxy recipes of docs/operations.md (deploy/nginx.conf, deploy/haproxy.cfg) as pasted, with the real
nginx and HAProxy from Debian's packages in front of a real gateway (gunicorn, gevent) and the
simulator, all on loopback. Each recipe is used word for word; only its listen port and its
upstream address are replaced, and it is wrapped in the settings Debian's own main files have.

Through each proxy: a stream arrives token by token (the gaps between chunks within 10 ms of a
direct connection's), a 70 s non-streaming request answers 200, a stream cut by a dying worker
raises in the OpenAI SDK, a client that leaves (a stream or a non-streaming request) is recorded
as 499, the client's address reaches the gateway from the proxy only, and /metrics is not served.

Outside CI the tests skip when nginx or haproxy is not installed; under CI=true they must run
(``.ci/run`` installs both).
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
import requests

from tests.integration.harness import REPO, Gateway, ModelSpec, Sim
from tests.support.proxies import Proxy, start_proxy, wait_proxied

pytestmark = [pytest.mark.integration]
MODEL = "anthropic/claude-sonnet-5-5"
PROXIES = ("nginx", "haproxy")
CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with text (not the role chunk's "")

# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def proxy_sim() -> Iterator[Sim]:
    server = Sim(name="sim-proxy").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(proxy_sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("proxied")
    models = [ModelSpec(deployments=[{"name": "sim-proxy", "base_url": proxy_sim.url}])]
    server = Gateway(
        root=root,
        models=models,
        workers=1,  # the stream's worker is the one child of the master
        gateway_settings={"keepalive_s": 15},
        env={"EZAT_ACCESS_LOG": str(root / "access.log")},
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw_key(gw: Gateway) -> str:
    return gw.new_key("proxied")


@pytest.fixture(scope="module")
def health_path(gw: Gateway) -> str:
    """/readyz where the gateway has it, else /healthz (the recipes name /readyz)."""
    return "/readyz" if requests.get(gw.url + "/readyz", timeout=5).status_code == 200 else "/healthz"


@pytest.fixture(scope="module")
def proxies(gw: Gateway, health_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proxy]]:
    root = tmp_path_factory.mktemp("proxies")
    started: dict[str, Proxy] = {}
    try:
        for name in PROXIES:
            started[name] = start_proxy(name, root, gw.url, health_path)
        yield started
    finally:
        for proxy in started.values():
            proxy.stop()


@pytest.fixture(params=PROXIES)
def proxy(request: pytest.FixtureRequest, proxies: dict[str, Proxy], gw: Gateway) -> Proxy:
    """One proxy, the gateway healthy through it (a previous test may have killed a worker)."""
    chosen = proxies[request.param]
    assert wait_proxied(chosen, timeout_s=30), f"{chosen.name}: the gateway is not healthy through it"
    return chosen


# ---------------------------------------------------------------- helpers


def chat(text: str, *, stream: bool = False, max_tokens: int = 400) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_completion_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
    }
    if stream:
        body["stream"] = True
    return body


def chunk_times(base_url: str, key: str, text: str) -> list[float]:
    """Arrival times (monotonic seconds) of each content chunk of one stream, as read from the
    socket (chunks that arrive glued together share one time)."""
    times: list[float] = []
    with requests.post(
        base_url + "/openai/v1/chat/completions",
        json=chat(text, stream=True),
        headers={"authorization": f"Bearer {key}"},
        stream=True,
        timeout=60,
    ) as response:
        assert response.status_code == 200
        for data in response.iter_content(chunk_size=None):
            now = time.monotonic()
            times += [now] * len(CONTENT.findall(data))
    return times


def gaps_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def ledger_row(gw: Gateway, request_id: str, timeout_s: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = [r for r in gw.usage() if r["request_id"] == request_id]
        if rows:
            return rows[0]
        time.sleep(0.3)
    raise AssertionError(f"no ledger row for request {request_id} in {timeout_s} s")


def send_and_leave(base_url: str, key: str, body: dict[str, Any], read_until: bytes | None) -> str:
    """Send a request on a raw socket, read the response until ``read_until`` appears, close
    the socket and return the response's request id. With None the client leaves before any
    answer (a non-streaming reply's headers come with its body) and no id is known: ""."""
    url = urlparse(base_url)
    data = json.dumps(body).encode()
    request_id = ""
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        conn.sendall(
            b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        if read_until is None:
            time.sleep(0.8)  # the upstream is still working: the client leaves
            return ""
        received = b""
        deadline = time.monotonic() + 20
        while read_until not in received and time.monotonic() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        assert read_until in received, received[:500]
        for line in received.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
            name, _, value = line.decode().partition(":")
            if name.lower() == "request-id":
                request_id = value.strip()
    assert request_id
    return request_id


def worker_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True, timeout=10).stdout
    return [int(pid) for pid in out.split()]


def access_lines(gw: Gateway, marker: str, timeout_s: float = 10) -> list[str]:
    path = gw.root / "access.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = (
            [line for line in path.read_text(errors="replace").splitlines() if marker in line] if path.exists() else []
        )
        if lines:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no access log line with {marker!r} in {path}")


def get_from(source_ip: str, base_url: str, path: str, headers: dict[str, str]) -> int:
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10, source_address=(source_ip, 0))
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# ---------------------------------------------------------------- tests


def test_a_stream_arrives_token_by_token(proxy: Proxy, gw: Gateway, gw_key: str) -> None:
    text = "count [[sim:token_delay_ms=50,words=120]]"  # 40 deltas of 3 words
    direct = chunk_times(gw.url, gw_key, text)
    proxied = chunk_times(proxy.url, gw_key, text)
    assert len(proxied) == len(direct) >= 30
    d, p = gaps_ms(direct), gaps_ms(proxied)
    assert abs(statistics.median(p) - statistics.median(d)) <= 10, (proxy.name, statistics.median(p), d)
    assert abs(p90(p) - p90(d)) <= 10, (proxy.name, p90(p), p90(d))
    assert min(p) > 25, f"{proxy.name} glued chunks together: {sorted(p)[:5]}"


@pytest.mark.slow
def test_a_70_s_request_answers_200_through_both_proxies(proxies: dict[str, Proxy], gw: Gateway, gw_key: str) -> None:
    """Past nginx's 60 s and HAProxy's 50 s defaults; both proxies at once, in threads."""
    results: dict[str, tuple[int, str, str]] = {}

    def call(name: str) -> None:
        response = requests.post(
            proxies[name].url + "/openai/v1/chat/completions",
            json=chat("a long one [[sim:delay=70]]", max_tokens=64),
            headers={"authorization": f"Bearer {gw_key}"},
            timeout=120,
        )
        results[name] = (response.status_code, response.headers.get("request-id", ""), response.text)

    threads = [threading.Thread(target=call, args=(name,)) for name in PROXIES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=130)
    for name in PROXIES:
        status, request_id, text = results[name]
        assert status == 200, (name, status, text[:300])
        assert json.loads(text)["choices"][0]["message"]["content"]
        assert ledger_row(gw, request_id)["status"] == 200


def test_a_client_that_leaves_a_stream_is_recorded_as_499(proxy: Proxy, gw: Gateway, gw_key: str) -> None:
    body = chat("leave me [[sim:token_delay_ms=100,words=100]]", stream=True)
    request_id = send_and_leave(proxy.url, gw_key, body, read_until=b'"content":"')
    row = ledger_row(gw, request_id)
    assert row["status"] == 499, (proxy.name, row)


def test_a_client_that_leaves_a_non_streaming_request_is_recorded_as_499(
    proxy: Proxy, gw: Gateway, gw_key: str, request: pytest.FixtureRequest
) -> None:
    """nginx closes its connection to the gateway when the client leaves (the gateway's peek
    sees it). HAProxy 2.6 takes the client's FIN for a half-close and keeps waiting for the
    answer (``option abortonclose`` only drops requests still queued or connecting), so the
    gateway can't know: recorded as 200. Strict: this fails once HAProxy passes it on."""
    if proxy.name == "haproxy":
        request.applymarker(pytest.mark.xfail(strict=True, reason="HAProxy 2.6 keeps a half-closed request"))
    before = {r["request_id"] for r in gw.usage()}
    send_and_leave(proxy.url, gw_key, chat("slow one [[sim:delay=2]]", max_tokens=64), read_until=None)
    deadline = time.monotonic() + 20
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not rows:
        rows = [r for r in gw.usage() if r["request_id"] not in before]
        time.sleep(0.3)
    assert [r["status"] for r in rows] == [499], (proxy.name, rows)


def test_the_client_address_reaches_the_gateway_from_the_proxy_only(proxy: Proxy, gw: Gateway) -> None:
    """The client (127.0.0.2) forges an X-Forwarded-For; through the proxy the gateway sees the
    client's own address, directly (from 127.0.0.3) it sees the peer and ignores the header."""
    forged = {"X-Forwarded-For": "203.0.113.66"}
    through = f"ezat-test-{uuid.uuid4().hex}"
    assert get_from("127.0.0.2", proxy.url, "/api/models", {**forged, "User-Agent": through}) == 200
    (line,) = access_lines(gw, through)
    assert line.split()[0] == "127.0.0.2", line
    direct = f"ezat-test-{uuid.uuid4().hex}"
    assert get_from("127.0.0.3", gw.url, "/api/models", {**forged, "User-Agent": direct}) == 200
    (line,) = access_lines(gw, direct)
    assert line.split()[0] == "127.0.0.3", line


@pytest.mark.parametrize("path", ["/metrics", "/metrics?x=1", "//metrics", "/%6detrics"])
def test_metrics_are_not_served_through_the_proxy(proxy: Proxy, gw: Gateway, path: str) -> None:
    assert requests.get(gw.url + "/metrics", timeout=5).status_code == 200
    response = requests.get(proxy.url + path, timeout=5, allow_redirects=True)
    assert response.status_code == 404 and "ezat_" not in response.text, (proxy.name, path, response.status_code)


def test_a_stream_cut_by_a_dying_worker_raises_in_the_openai_sdk(proxy: Proxy, gw: Gateway, gw_key: str) -> None:
    """With HTTP/1.1 to the gateway the cut leaves the chunked body incomplete (with HTTP/1.0 it
    would look like a normal end). Last in the file: the master then starts a new worker."""
    assert gw.proc is not None
    client = openai.OpenAI(base_url=proxy.url + "/openai/v1", api_key=gw_key, max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL,
        max_completion_tokens=1000,
        stream=True,
        messages=[{"role": "user", "content": "cut me [[sim:token_delay_ms=100,words=300]]"}],
    )
    chunks = iter(stream)
    received = 0
    while received < 5:
        chunk = next(chunks)
        received += bool(chunk.choices and chunk.choices[0].delta.content)
    (worker,) = worker_pids(gw.proc.pid)
    os.kill(worker, signal.SIGKILL)
    with pytest.raises(Exception) as caught:  # the SDK's or its HTTP library's error, never a normal end
        for chunk in chunks:
            received += bool(chunk.choices and chunk.choices[0].delta.content)
    assert received < 100, (proxy.name, received, caught.value)


@pytest.mark.parametrize("recipe", ["nginx.conf", "haproxy.cfg"])
def test_the_operations_page_shows_the_recipes_as_tested(recipe: str) -> None:
    assert (REPO / "deploy" / recipe).read_text().rstrip() in (REPO / "docs" / "operations.md").read_text()
