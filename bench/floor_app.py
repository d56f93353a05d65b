"""The stack floor: the bare Flask + gevent + requests hop that every request of ours also pays.

    gunicorn -c bench/floor_gunicorn.py --pythonpath bench floor_app:app

A minimal Flask app at ``POST /openai/v1/chat/completions``, run by gunicorn with our gateway's
gevent worker settings (``floor_gunicorn.py``). For each request it reads and parses the OpenAI
body (to learn ``stream``), makes the upstream call (a POST to ``/v1/messages`` on the
simulator, keep-alive, the gateway's timeouts) with the stack's HTTP client, one
``requests.Session`` per worker with a pooled ``HTTPAdapter`` (as our upstream client keeps), and
returns the upstream's answer as it came: the JSON body whole, or the SSE bytes relayed chunk by
chunk through a generator (``iter_content(chunk_size=None)``). No auth, no database, no rate
limits, no validation, no translation, no SSE parsing, no metrics.

Without translation the upstream body cannot be derived from the client's, so the benchmark
hands the floor a table (``FLOOR_BODIES``, a JSON file of ``[openai body, anthropic body]``
pairs): each OpenAI body the load generator sends, byte for byte, and the equivalent Anthropic
body (the one the direct target is sent). An unknown body answers 400.

Environment: ``FLOOR_UPSTREAM`` (the simulator's base URL), ``FLOOR_BODIES`` (the table),
``FLOOR_API_KEY`` (sent as ``x-api-key``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import requests
from flask import Flask, Response, request
from requests.adapters import HTTPAdapter

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
    """One Session per process (made after the fork), its adapter pooled as our upstream client's."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.api_key = api_key
        self._session: requests.Session | None = None
        self._pid = 0

    @property
    def session(self) -> requests.Session:
        if self._session is None or self._pid != os.getpid():
            session = requests.Session()
            session.trust_env = False
            session.mount("http://", HTTPAdapter(pool_maxsize=POOL_SIZE, pool_block=True, max_retries=0))
            self._session, self._pid = session, os.getpid()
        return self._session

    def post(self, body: bytes, *, stream: bool) -> requests.Response:
        read = STREAM_IDLE_TIMEOUT_S if stream else READ_TIMEOUT_S
        return self.session.post(
            self.url,
            data=body,
            headers=upstream_headers(self.api_key, stream=stream),
            stream=stream,
            timeout=(CONNECT_TIMEOUT_S, read),
            allow_redirects=False,
        )


def relay(response: requests.Response) -> Iterator[bytes]:
    """The upstream's SSE bytes as they arrive; the connection goes back to the pool when the
    body was read to its end (``close`` drops it otherwise)."""
    try:
        yield from response.iter_content(chunk_size=None)
    finally:
        response.close()


def create_app(upstream: Upstream, bodies: dict[bytes, bytes]) -> Flask:
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
        if stream and response.status_code == 200:
            return Response(
                relay(response), status=200, content_type=content_type, headers={"cache-control": "no-cache"}
            )
        return Response(response.content, status=response.status_code, content_type=content_type)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', content_type="application/json")

    return app


def floor_environment() -> tuple[Upstream, dict[bytes, bytes]]:
    """The upstream and the body table the environment names (``FLOOR_*``)."""
    upstream = Upstream(os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:1"), os.environ.get("FLOOR_API_KEY", ""))
    table = os.environ.get("FLOOR_BODIES")
    return upstream, load_bodies(Path(table)) if table else {}


def _from_environment() -> Flask:
    return create_app(*floor_environment())


app = _from_environment()
