"""The stack floor: the bare Flask + gevent + HTTP hop that every request of ours also pays.

    gunicorn -c bench/floor_gunicorn.py --pythonpath bench floor_app:app

A minimal Flask app at ``POST /openai/v1/chat/completions``, run by gunicorn with our gateway's
gevent worker settings (``floor_gunicorn.py``). For each request it reads and parses the OpenAI
body (to learn ``stream``), makes the upstream call (a POST to ``/v1/messages`` on the
simulator, keep-alive, the gateway's timeouts) with the stack's HTTP client, one pooled
``urllib3.PoolManager`` per worker, and returns the upstream's answer as it came: the JSON body
whole, or the SSE bytes relayed chunk by chunk through a generator. No auth, no database, no
rate limits, no validation, no translation, no metrics.

The gateway itself no longer uses urllib3 on this path: its own transport
(``ezat_compat/upstream/transport.py``) makes the same call with less CPU. The floor keeps
urllib3, the bare relay one would build on this stack; ``FLOOR_CLIENT=ezat`` makes it call
through the gateway's transport instead, to see how much of the gap that accounts for
(bench/RESULTS.md gives both).

Without translation the upstream body cannot be derived from the client's, so the benchmark
hands the floor a table (``FLOOR_BODIES``, a JSON file of ``[openai body, anthropic body]``
pairs): each OpenAI body the load generator sends, byte for byte, and the equivalent Anthropic
body (the one the direct target is sent). An unknown body answers 400.

Environment: ``FLOOR_UPSTREAM`` (the simulator's base URL), ``FLOOR_BODIES`` (the table),
``FLOOR_API_KEY`` (sent as ``x-api-key``), ``FLOOR_CLIENT`` (``urllib3``, the default, or ``ezat``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import urllib3
from flask import Flask, Response, request

CONNECT_TIMEOUT_S = 10.0  # the gateway's defaults: connect_timeout_s, upstream_timeout_s, stream_idle_timeout_s
READ_TIMEOUT_S = 590.0
STREAM_IDLE_TIMEOUT_S = 600.0
POOL_SIZE = 1000


def load_bodies(path: Path) -> dict[bytes, bytes]:
    """The table of (client body → upstream body), both as the bytes sent."""
    pairs = json.loads(path.read_text())
    return {client.encode(): upstream.encode() for client, upstream in pairs}


def upstream_headers(api_key: str, *, stream: bool) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "accept": "text/event-stream" if stream else "application/json",
        "user-agent": "ezat-bench-floor",
        "anthropic-version": "2023-06-01",
        "x-api-key": api_key,
    }


class Upstream:
    """One pooled PoolManager per process (made after the fork), as our upstream client keeps."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.api_key = api_key
        self._pool: urllib3.PoolManager | None = None
        self._pid = 0

    @property
    def pool(self) -> urllib3.PoolManager:
        if self._pool is None or self._pid != os.getpid():
            self._pool = urllib3.PoolManager(num_pools=64, maxsize=POOL_SIZE, block=False, retries=False)
            self._pid = os.getpid()
        return self._pool

    def post(self, body: bytes, *, stream: bool) -> urllib3.BaseHTTPResponse:
        headers = upstream_headers(self.api_key, stream=stream)
        read = STREAM_IDLE_TIMEOUT_S if stream else READ_TIMEOUT_S
        return self.pool.urlopen(
            "POST",
            self.url,
            body=body,
            headers=headers,
            preload_content=False,
            retries=False,
            redirect=False,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=read),
        )


def relay(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The upstream's SSE bytes as they arrive; the connection goes back to the pool only when
    the body was read to its end."""
    complete = False
    try:
        if response.chunked:
            yield from response.read_chunked(None, decode_content=True)  # type: ignore[attr-defined]
        else:
            while chunk := response.read1(65536):  # type: ignore[attr-defined]
                yield chunk
        complete = True
    finally:
        if complete:
            response.release_conn()
        else:
            response.close()


class EzatUpstream:
    """``FLOOR_CLIENT=ezat``: the same call through the gateway's own HTTP/1.1 transport, with
    the same headers and timeouts (its connections made after the fork)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self._origin: Any = None
        self._pid = 0

    def post(self, body: bytes, *, stream: bool) -> Any:
        from ezat_compat.upstream.transport import Origin

        if self._origin is None or self._pid != os.getpid():
            self._origin, self._pid = Origin(self.base_url, max_idle=POOL_SIZE), os.getpid()
        headers = upstream_headers(self.api_key, stream=stream)
        read = STREAM_IDLE_TIMEOUT_S if stream else READ_TIMEOUT_S
        return _EzatResponse(
            self._origin.request(
                "POST", "/v1/messages", headers, body, connect_timeout=CONNECT_TIMEOUT_S, read_timeout=read
            )
        )


class _EzatResponse:
    """The transport's response with the few urllib3 response methods the floor calls."""

    chunked = False

    def __init__(self, response: Any) -> None:
        self._response = response
        self.status = response.status
        self.headers = response.headers

    def read(self) -> bytes:
        data: bytes = self._response.read_all()
        return data

    def read1(self, _size: int) -> bytes:
        data: bytes = self._response.read()
        return data

    def release_conn(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()


def create_app(upstream: Upstream | EzatUpstream, bodies: dict[bytes, bytes]) -> Flask:
    app = Flask("floor")

    @app.post("/openai/v1/chat/completions")
    def chat_completions() -> Response:
        raw = request.get_data()
        stream = json.loads(raw).get("stream") is True
        body = bodies.get(raw)
        if body is None:
            return Response(b'{"error":"unknown body"}', status=400, content_type="application/json")
        response = upstream.post(body, stream=stream)
        content_type = response.headers.get("content-type", "application/json")
        if stream and response.status == 200:
            return Response(
                relay(response), status=200, content_type=content_type, headers={"cache-control": "no-cache"}
            )
        data = response.read()
        response.release_conn()
        return Response(data, status=response.status, content_type=content_type)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', content_type="application/json")

    return app


def _from_environment() -> Flask:
    client = EzatUpstream if os.environ.get("FLOOR_CLIENT") == "ezat" else Upstream
    upstream = client(os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:1"), os.environ.get("FLOOR_API_KEY", ""))
    table = os.environ.get("FLOOR_BODIES")
    return create_app(upstream, load_bodies(Path(table)) if table else {})


app = _from_environment()
