"""What both dialects' blueprints share: request ids, keys, bodies, JSON responses."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from flask import Request, Response, after_this_request, current_app, g

from ezat_compat.api.bodies import close_connection, read_within
from ezat_compat.api.sse import stream_response
from ezat_compat.cooperative import readable_now
from ezat_compat.dialects import Headers
from ezat_compat.domain import Config
from ezat_compat.errors import RequestTimeoutError, RequestTooLargeError
from ezat_compat.pipeline import ClientRequest, Gateway, Reply
from ezat_compat.session import StreamSession

JSON_TYPE = "application/json"
T = TypeVar("T")


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


def unproxied(obj: T) -> T:
    """The object behind a context proxy (Flask's ``request``, ``g``, ``current_app``), for code
    that reads it more than once: every attribute read through the proxy looks the context up
    again (about 2 µs each here); werkzeug's ``_get_current_object`` is the proxy's own way out.
    Anything that is not a proxy is returned as it is."""
    get = getattr(obj, "_get_current_object", None)
    return get() if get is not None else obj


def gateway() -> Gateway:
    gw: Gateway = current_app.extensions["ezat"]
    return gw


def request_id() -> str:
    rid: str = g.request_id
    return rid


def api_key(request: Request) -> str | None:
    return api_key_of(request.headers)


def api_key_of(headers: Headers) -> str | None:
    """The key from ``x-api-key`` or ``Authorization: Bearer``, without the SP and HTAB around
    it (HTTP's only optional whitespace: a U+00A0 is part of the value, so the key is unknown)."""
    key = (headers.get("x-api-key") or "").strip(" \t")
    if key:
        return key
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    token = token.strip(" \t")
    if scheme.lower() == "bearer" and token:
        return token
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


def read_body(request: Request, config: Config | None = None) -> bytes:
    """``read_environ_body`` of a Flask request (``config``: the gateway's, when the caller has
    it at hand); after a 408 the connection is closed."""
    try:
        return read_environ_body(request.environ, request.content_length, config or gateway().config)
    except RequestTimeoutError:
        shut = close_connection(request.environ)
        if shut is not None:

            @after_this_request
            def _shut_after(response: Response) -> Response:
                response.call_on_close(shut)
                return response

        raise


def client_request(request: Request, config: Config | None = None) -> ClientRequest:
    """What the pipeline needs of this request: id, key, headers, the body on demand, whether
    the client is still connected, and its log record. ``config``: the gateway's, when the
    caller has it at hand. The request and ``g`` are read behind their proxies (``unproxied``)."""
    req, context = unproxied(request), unproxied(g)
    sock = req.environ.get("gunicorn.socket")
    connected = (lambda: still_connected(sock)) if sock is not None else (lambda: True)
    headers = req.headers
    return ClientRequest(
        context.request_id, api_key_of(headers), headers, lambda: read_body(req, config), connected, context.record
    )


def still_connected(sock: socket.socket) -> bool:
    """False when the client closed its side (a peek reads end-of-file); never blocks."""
    try:
        if not readable_now(sock):
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
    # ``content_type``: what ``mimetype`` would make of it (JSON takes no charset), not made again per response
    return Response(data, status=status, content_type=JSON_TYPE, headers=headers)
