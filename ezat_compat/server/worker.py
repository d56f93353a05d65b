"""The gateway's gunicorn worker: gunicorn's gevent worker, with gunicorn's own refusals in the
API's JSON envelope.

gunicorn answers a request it can't parse (a bad request line, a header over its limits: 400,
414, 431…) itself, before the app sees it, with an HTML page. Clients of this gateway read
errors as JSON: the same answer, status and reason as gunicorn's, carries the envelope of the
dialect the path names — Anthropic's for ``/v1/messages``, OpenAI's for everything else (a
request line too broken to name a path gets OpenAI's).

How: ``worker_class`` names this class (gunicorn's documented way to bring a worker). Its
``handle_error`` lets gunicorn's own decide everything (the status, the reason, the log and
access lines) with a client socket that keeps what gunicorn would write; then it writes the
JSON answer with that status line instead. Nothing of gunicorn is replaced at run time.

This module is imported by the master when it loads the worker class, before any worker is
forked and patched by gevent: it imports gunicorn's worker module and the standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

ANTHROPIC_PREFIX = "/v1/messages"


class _Kept:
    """The client socket for gunicorn's error page: what it sends is kept, not sent; every other
    call reaches the socket."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.sent = b""

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def send(self, data: bytes) -> int:
        self.sent += data
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def status_of(page: bytes) -> tuple[int, str] | None:
    """(status, reason) of the response head gunicorn wrote, or None."""
    line = page.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2] if len(parts) > 2 else ""


def error_answer(status: int, reason: str, detail: str, path: str | None) -> bytes:
    """The whole HTTP answer (head and JSON body) for gunicorn's refusal ``status`` on ``path``."""
    message = f"{reason}: {detail}" if detail else reason
    if path is not None and (path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")):
        kind = "api_error" if status >= 500 else "invalid_request_error"
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode("latin-1") + payload


class JSONErrorsGeventWorker(GeventWorker):
    """gunicorn's gevent worker; its own refusals answer in the JSON envelope."""

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        kept = _Kept(client)
        super().handle_error(req, kept, addr, exc)
        head = status_of(kept.sent)
        if head is None:  # nothing (or nothing we read) was written: pass it on as it was
            if kept.sent:
                util.write_nonblock(client, kept.sent)
            return
        status, reason = head
        req = req if req is not None else getattr(exc, "req", None)  # a bad header keeps its request
        path = getattr(req, "path", None) if req is not None else None
        detail = "" if status >= 500 else str(exc)
        try:
            util.write_nonblock(client, error_answer(status, reason, detail, path))
        except Exception:
            self.log.debug("Failed to send error message.")
