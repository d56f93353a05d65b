"""The hot routes served without Flask's per-request machinery: ``POST
/openai/v1/chat/completions``, ``POST /v1/messages`` and ``POST /openai/v1/responses``.

Why: under load, Flask's request context (URL adapter, routing, ``g``), its dispatch, its
hooks and a werkzeug ``Response`` (and, for a stream, two wrappers per chunk) cost about
0.3 ms of CPU per request, an eighth of a whole request of ours (``bench/RESULTS.md``). This
WSGI layer sits in front of the Flask app and serves those two exact paths itself, doing
exactly what the app's hooks, views and error handlers do for them: the request id and its
``RequestRecord``, ``Gateway.handle`` with the same ``ClientRequest``, the same JSON or
event-stream response with the same headers (``request-id``, ``x-request-id``), errors in the
dialect's envelope (an unexpected one logged with its traceback, a database or Redis outage
noted once), the request's log line, a 408 that closes its connection. Every other request —
another path or method, or any request on the ``metrics_bind`` listener — goes to the app
unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from werkzeug.utils import get_content_type
from werkzeug.wsgi import get_content_length

from ezat_compat.api.bodies import close_connection
from ezat_compat.api.common import JSON_TYPE, api_key_of, new_request_id, read_environ_body, still_connected
from ezat_compat.api.sse import SSE_HEADERS, StreamBody
from ezat_compat.dialects import Dialect
from ezat_compat.errors import GatewayError, RequestTimeoutError
from ezat_compat.logs import RequestLog, RequestRecord
from ezat_compat.pipeline import ClientRequest, Gateway, Reply
from ezat_compat.readiness import Readiness, outage_of

log = logging.getLogger("ezat_compat")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
STREAM_TYPE = get_content_type("text/event-stream", "utf-8")  # what werkzeug's mimetype= gives
_STREAM_HEADERS = [("Content-Type", STREAM_TYPE), *SSE_HEADERS.items()]
_REASONS: dict[int, str] = {}


def status_line(code: int) -> str:
    """``"200 OK"``: the WSGI status of ``code``, as werkzeug writes it."""
    line = _REASONS.get(code)
    if line is None:
        from werkzeug.http import HTTP_STATUS_CODES

        line = _REASONS[code] = f"{code} {HTTP_STATUS_CODES.get(code, 'UNKNOWN').upper()}"
    return line


def note_outage(readiness: Readiness, exc: BaseException) -> bool:
    """An outage of the database or Redis is logged once per incident (``Outages``), not per
    request; True when ``exc`` is one."""
    what = outage_of(exc)
    if what is None:
        return False
    if what == "redis" and not readiness.redis_url:
        what = "rate-limit counters"
    readiness.outages.failed(what, exc)
    return True


def unexpected_error(request_id: str | None) -> GatewayError:
    """What the client gets for a bug: a 500 that quotes the request id, nothing internal."""
    return GatewayError(f"The gateway failed to process the request; quote request id {request_id or '?'} to support.")


class _Closing:
    """A response body that runs ``after`` once the server is done with it (a 408's shutdown)."""

    def __init__(self, body: Iterable[bytes], after: Callable[[], None]) -> None:
        self._body = body
        self._after = after

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._after()


_ENVIRON_NAMES: dict[str, str] = {}  # header field name -> its WSGI environ key, as looked up


class WSGIHeaders:
    """A request's header fields, read from the WSGI environ as werkzeug's ``EnvironHeaders``
    reads them (any case; ``Content-Type`` and ``Content-Length`` without the ``HTTP_``
    prefix), ``get`` only: what the pipeline and the dialects look up. The environ key of each
    name is worked out once per process."""

    __slots__ = ("environ",)

    def __init__(self, environ: Mapping[str, Any]) -> None:
        self.environ = environ

    def get(self, key: str, default: str | None = None) -> str | None:
        name = _ENVIRON_NAMES.get(key)
        if name is None:
            upper = key.upper().replace("-", "_")
            name = upper if upper in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{upper}"
            if len(_ENVIRON_NAMES) < 1024:  # the gateway's own names; any others are not kept
                _ENVIRON_NAMES[key] = name
        value = self.environ.get(name)
        return default if value is None else str(value)


class HotRoutes:
    """WSGI middleware: the hot ``routes`` (path -> dialect and the app's view name) served
    here, everything else by ``app``. ``metrics_only(environ)``: the request came in on the
    metrics listener (the app answers 404 there)."""

    def __init__(
        self,
        app: WSGIApp,
        gateway: Gateway,
        request_log: RequestLog,
        readiness: Readiness,
        routes: Mapping[str, tuple[Dialect, str]],
        metrics_only: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.request_log = request_log
        self.readiness = readiness
        self.routes = dict(routes)
        self.metrics_only = metrics_only

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = self.routes.get(path) if environ.get("REQUEST_METHOD") == "POST" else None
        if route is None or (self.metrics_only is not None and self.metrics_only(environ)):
            return self.app(environ, start_response)
        dialect, view = route
        request_id = new_request_id()
        record = self.request_log.start(request_id, "POST", path, environ.get("REMOTE_ADDR") or "", view)
        try:
            return self._serve(dialect, environ, start_response, request_id, record)
        except BaseException:  # nothing answered (start_response raised, the greenlet was killed)
            record.unanswered()
            raise

    def _serve(
        self,
        dialect: Dialect,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        request_id: str,
        record: RequestRecord,
    ) -> Iterable[bytes]:
        gw = self.gateway
        headers = WSGIHeaders(environ)
        sock = environ.get("gunicorn.socket")
        shut: Callable[[], None] | None = None

        def read_body() -> bytes:
            nonlocal shut
            try:
                return read_environ_body(environ, get_content_length(environ), gw.config)
            except RequestTimeoutError:
                shut = close_connection(environ)
                raise

        request = ClientRequest(
            request_id,
            api_key_of(headers),
            headers,
            read_body,
            (lambda: still_connected(sock)) if sock is not None else (lambda: True),
            record,
        )
        body: Iterable[bytes]
        failure: GatewayError | None = None
        try:
            result = gw.handle(dialect, request)
        except GatewayError as err:
            if err.status >= 500:
                note_outage(self.readiness, err)
            failure = err
        except Exception as exc:
            if not note_outage(self.readiness, exc):
                log.exception("unexpected error in request %s", request_id)
            failure = unexpected_error(request_id)
        if failure is not None:
            record.note_error(failure)
            status, data, extra = dialect.render_error(failure, request_id)
            body = [data]
            out = [("Content-Type", JSON_TYPE), ("Content-Length", str(len(data))), *extra.items()]
        elif isinstance(result, Reply):
            status, body = result.status, [result.body]
            out = [("Content-Type", JSON_TYPE), ("Content-Length", str(len(result.body)))]
        else:
            status, body, out = 200, StreamBody(result), list(_STREAM_HEADERS)
        out.append(("request-id", request_id))
        out.append(("x-request-id", request_id))  # what the OpenAI SDKs read (``_request_id``)
        record.answered(status)
        try:
            start_response(status_line(status), out)
        except BaseException:  # the body never reaches the server: a stream must still end (and settle)
            close = getattr(body, "close", None)
            if close is not None:
                close()
            raise
        return _Closing(body, shut) if shut is not None else body
