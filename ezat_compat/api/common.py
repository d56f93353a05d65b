"""What both dialects' blueprints share: request ids, keys, bodies, JSON responses."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from flask import Request, Response, after_this_request, current_app, g
from gevent.monkey import get_original

from ezat_compat.api.bodies import close_connection, read_within
from ezat_compat.api.sse import stream_response
from ezat_compat.dialects import Headers
from ezat_compat.domain import Config
from ezat_compat.errors import RequestTimeoutError, RequestTooLargeError
from ezat_compat.pipeline import ClientRequest, Gateway, Reply
from ezat_compat.session import StreamSession

JSON_TYPE = "application/json"
# The system's select, not gevent's: with a zero timeout it never blocks, and it is one system
# call where gevent's makes and drops a watcher per socket (~35 µs a request under load).
_poll_select = get_original("select", "select")


def new_request_id() -> str:
    """A UUIDv7 string: time-ordered, 74 random bits (RFC 9562)."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        ((ms & 0xFFFFFFFFFFFF) << 80)
        | (0x7 << 76)
        | (((rand >> 62) & 0xFFF) << 64)
        | (0b10 << 62)
        | (rand & ((1 << 62) - 1))
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def gateway() -> Gateway:
    gw: Gateway = current_app.extensions["ezat"]
    return gw


def request_id() -> str:
    rid: str = g.request_id
    return rid


def api_key(request: Request) -> str | None:
    return api_key_of(request.headers)


def api_key_of(headers: Headers) -> str | None:
    """The key from ``x-api-key`` or ``Authorization: Bearer``."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def too_large(config: Config | None = None) -> RequestTooLargeError:
    limit = (config or gateway().config).gateway.max_body_mb
    return RequestTooLargeError(f"The request body is larger than {limit:g} MB.")


def read_environ_body(environ: Mapping[str, Any], length: int | None, config: Config) -> bytes:
    """The raw body of a WSGI request of ``length`` bytes (None: chunked), refused with 413 as
    soon as it passes ``max_body_mb`` (from the length before anything is read, or while
    reading a chunked body), and with 408 when it doesn't arrive within its deadline
    (``api/bodies.py``; the caller closes the connection then)."""
    max_bytes = config.max_body_bytes
    if length is not None and length > max_bytes:
        raise too_large(config)
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    return read_within(stream, length, config.server, max_bytes, lambda: too_large(config))


def read_body(request: Request) -> bytes:
    """``read_environ_body`` of a Flask request; after a 408 the connection is closed."""
    try:
        return read_environ_body(request.environ, request.content_length, gateway().config)
    except RequestTimeoutError:
        shut = close_connection(request.environ)
        if shut is not None:

            @after_this_request
            def _shut_after(response: Response) -> Response:
                response.call_on_close(shut)
                return response

        raise


def client_request(request: Request) -> ClientRequest:
    """What the pipeline needs of this request: id, key, headers, the body on demand, whether
    the client is still connected, and its log record."""
    sock = request.environ.get("gunicorn.socket")
    connected = (lambda: still_connected(sock)) if sock is not None else (lambda: True)
    return ClientRequest(
        request_id(), api_key(request), request.headers, lambda: read_body(request), connected, g.record
    )


def still_connected(sock: socket.socket) -> bool:
    """False when the client closed its side (a peek reads end-of-file); never blocks."""
    try:
        readable, _, _ = _poll_select([sock], [], [], 0)
        if not readable:
            return True
        return sock.recv(1, socket.MSG_PEEK) != b""
    except (OSError, ValueError):
        return False


def respond(result: Reply | StreamSession) -> Response:
    """The pipeline's result as the HTTP response: JSON, or the stream writer."""
    if isinstance(result, Reply):
        return raw_json_response(result.body, result.status)
    return stream_response(result)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return Response(data, status=status, mimetype=JSON_TYPE, headers=headers)


def raw_json_response(data: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(data, status=status, mimetype=JSON_TYPE, headers=headers)
