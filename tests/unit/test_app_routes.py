"""The app's hooks, views and error handlers on the pipeline's routes (``POST
/openai/v1/chat/completions``, ``POST /v1/messages``, ``POST /openai/v1/responses``), through
Flask's own dispatch: the request id headers, the ``ClientRequest`` the pipeline gets, the
request's log record, errors in the dialect's envelope, the metrics listener."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from werkzeug.test import Client, EnvironBuilder

from ezat_compat.api.anthropic import EXTENSION as MESSAGES_EXTENSION
from ezat_compat.app import create_app
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.errors import GatewayError, InvalidRequestError
from ezat_compat.pipeline import ClientRequest, Reply
from ezat_compat.server.metrics import Metrics
from tests.support.pipeline import CONFIG

ROUTES = ["/openai/v1/chat/completions", "/openai/v1/completions", "/v1/messages"]


class FakeGateway:
    """``handle`` runs ``answer`` on what the view hands the pipeline."""

    def __init__(self, answer: Callable[[ClientRequest], Any], config: Any = CONFIG) -> None:
        self.answer = answer
        self.config = config
        self.metrics = Metrics(CollectorRegistry())
        self.requests: list[ClientRequest] = []
        self.dialects: list[Any] = []

    def handle(self, dialect: Any, request: ClientRequest) -> Any:
        self.requests.append(request)
        self.dialects.append(dialect)
        return self.answer(request)


def app_with(answer: Callable[[ClientRequest], Any], config: Any = CONFIG) -> tuple[Client, FakeGateway]:
    gw = FakeGateway(answer, config)
    app = create_app(config, gateway_core=gw)  # type: ignore[arg-type]
    # The native dialect is built on first use from the gateway's database; one without a thread
    # store stands in (the fake has no database).
    app.extensions[MESSAGES_EXTENSION] = AnthropicMessages()
    return Client(app), gw


def test_a_reply_is_the_json_body_with_the_request_id_headers_and_its_log_record() -> None:
    bodies: list[bytes] = []
    client, gw = app_with(lambda r: bodies.append(r.read_body()) or Reply(b'{"ok":true}'))
    resp = client.post("/openai/v1/chat/completions", data=b'{"model":"m"}', headers={"Authorization": "Bearer sk-1"})
    assert (resp.status_code, resp.data, resp.headers["content-type"]) == (200, b'{"ok":true}', "application/json")
    assert resp.headers["content-length"] == "11"
    (request,) = gw.requests
    assert resp.headers["request-id"] == resp.headers["x-request-id"] == request.request_id
    assert request.api_key == "sk-1" and bodies == [b'{"model":"m"}']
    assert request.headers.get("AUTHORIZATION") == "Bearer sk-1"  # looked up in any case
    record = request.record
    assert (record.request_id, record.method, record.path, record.view, record.status, record.done) == (
        request.request_id,
        "POST",
        "/openai/v1/chat/completions",
        "openai.chat_completions",
        200,
        True,
    )


def test_the_key_may_come_as_x_api_key() -> None:
    client, gw = app_with(lambda r: Reply(b"{}"))
    client.post("/v1/messages", data=b"{}", headers={"x-api-key": " sk-2 "})
    assert gw.requests[0].api_key == "sk-2" and gw.requests[0].record.view == "anthropic.messages"


@pytest.mark.parametrize(
    ("path", "status", "envelope"),
    [
        ("/openai/v1/chat/completions", 400, "openai"),
        ("/v1/messages", 400, "anthropic"),
        ("/openai/v1/responses", 400, "openai"),
        ("/openai/v1/completions", 400, "openai"),
    ],
)
def test_a_gateway_error_is_rendered_in_the_dialects_envelope(path: str, status: int, envelope: str) -> None:
    def refuse(_r: ClientRequest) -> Any:
        raise InvalidRequestError("messages: Field required", param="messages")

    client, gw = app_with(refuse)
    if path.endswith("/responses"):  # the dialect is built on first use; a ready-made one stands in
        client.application.extensions["ezat_responses"] = object()  # type: ignore[attr-defined]
    resp = client.post(path, data=b"{}")
    assert resp.status_code == status
    body = json.loads(resp.data)
    if envelope == "openai":
        assert body["error"]["message"] == "messages: Field required" and body["error"]["param"] == "messages"
    else:
        assert body["type"] == "error" and body["request_id"] == resp.headers["request-id"]
    assert resp.headers["x-request-id"] == resp.headers["request-id"]
    record = gw.requests[0].record
    assert record.status == status and record.error == "InvalidRequestError" and record.done


def test_an_unexpected_error_is_a_500_that_quotes_the_request_id_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bug(_r: ClientRequest) -> Any:
        raise RuntimeError("/srv/secret/path.py exploded")

    client, gw = app_with(bug)
    with caplog.at_level(logging.ERROR, logger="ezat_compat"):
        resp = client.post("/openai/v1/chat/completions", data=b"{}")
    rid = resp.headers["request-id"]
    assert resp.status_code == 500
    message = json.loads(resp.data)["error"]["message"]
    assert message == f"The gateway failed to process the request; quote request id {rid} to support."
    assert "secret" not in resp.data.decode()
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)
    record = gw.requests[0].record
    assert record.status == 500 and record.error == "GatewayError"


def test_a_5xx_gateway_error_keeps_its_status() -> None:
    def overloaded(_r: ClientRequest) -> Any:
        raise GatewayError("upstream exploded")

    client, _ = app_with(overloaded)
    resp = client.post("/v1/messages", data=b"{}")
    assert resp.status_code == 500 and json.loads(resp.data)["type"] == "error"


def test_a_responses_request_whose_dialect_cannot_be_built_is_a_500_in_openais_envelope() -> None:
    config = dataclasses.replace(CONFIG, path="/nonexistent/folder/ezat.toml")
    client, gw = app_with(lambda r: Reply(b"{}"), config)
    resp = client.post("/openai/v1/responses", data=b"{}")
    assert resp.status_code == 500 and "error" in json.loads(resp.data) and gw.requests == []
    assert resp.headers["request-id"]


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_over_the_limit_is_a_413_before_it_is_read(path: str) -> None:
    def read(r: ClientRequest) -> Any:
        r.read_body()
        return Reply(b"{}")

    client, _ = app_with(read)
    resp = client.post(path, data=b"{}", environ_overrides={"CONTENT_LENGTH": str(CONFIG.max_body_bytes + 1)})
    assert resp.status_code == 413
    error = json.loads(resp.data)["error"]
    assert (error["code"] if path.startswith("/openai/") else error["type"]) == "request_too_large"


class FakeSession:
    """Enough of a ``StreamSession`` for the body that wraps it: it is closed once, at the end."""

    closed = 0
    over = True

    def close(self) -> None:
        self.closed += 1


def test_a_stream_the_server_closes_before_its_first_chunk_is_still_closed_so_it_settles() -> None:
    session = FakeSession()
    client, _ = app_with(lambda r: session)
    environ = EnvironBuilder(path="/v1/messages", method="POST", data=b"{}").get_environ()
    started: list[Any] = []
    body = client.application(environ, lambda status, headers: started.append((status, dict(headers))))
    ((status, headers),) = started
    assert status == "200 OK" and headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    assert headers["x-request-id"] == headers["request-id"]
    body.close()  # what the server does when the client left while the headers were written
    assert session.closed == 1


class FakeSocket:
    def __init__(self, port: int) -> None:
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_the_metrics_listener_serves_only_metrics_and_probes() -> None:
    config = dataclasses.replace(CONFIG, server=dataclasses.replace(CONFIG.server, metrics_bind="127.0.0.1:9464"))
    client, gw = app_with(lambda r: Reply(b"{}"), config)
    on_metrics = {"gunicorn.socket": FakeSocket(9464)}
    on_main = {"gunicorn.socket": FakeSocket(8080)}
    resp = client.post("/openai/v1/chat/completions", data=b"{}", environ_overrides=on_metrics)
    assert resp.status_code == 404 and gw.requests == [] and resp.headers["request-id"]
    assert client.get("/healthz", environ_overrides=on_metrics).status_code == 200
    assert client.get("/metrics", environ_overrides=on_metrics).status_code == 200
    assert client.get("/metrics", environ_overrides=on_main).status_code == 404
    assert client.post("/openai/v1/chat/completions", data=b"{}", environ_overrides=on_main).status_code == 200


def test_an_answered_error_lets_go_of_its_frames() -> None:
    """The failover loop keeps its last error in a local and raises it: frame -> error ->
    traceback -> frame, a cycle only the cyclic collector would free (with the request's whole
    parsed body). Once answered, the error and those it came from drop their tracebacks."""
    import gc
    import weakref

    from ezat_compat.app import _let_go
    from ezat_compat.errors import GatewayError, UpstreamTimeoutError

    class Body:
        pass

    def failover(body: Body) -> None:
        last = None
        try:
            raise UpstreamTimeoutError("slow")
        except UpstreamTimeoutError as exc:
            last = exc
        raise GatewayError("no deployment answered") from last

    body = Body()
    alive = weakref.ref(body)
    gc.disable()
    try:
        try:
            failover(body)
        except GatewayError as err:
            caught = err
        del body
        assert alive() is not None  # held by the cycle
        _let_go(caught)
        assert caught.__traceback__ is None and caught.__cause__ is not None
        assert caught.__cause__.__traceback__ is None
        del caught
        assert alive() is None  # freed at once, no collector needed
    finally:
        gc.enable()


def test_an_unexpected_error_lets_go_of_its_frames_once_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug's 500 (the ``Exception`` handler) drops the error's frames too, after logging them:
    a frame that keeps the error it raised (a cycle) would hold the request until the collector.
    (pytest's log capture keeps every record with its traceback: the log goes elsewhere here.)"""
    monkeypatch.setattr(logging.getLogger("ezat_compat"), "propagate", False)
    import gc
    import weakref

    class Body:
        pass

    alive: list[weakref.ref[Body]] = []

    def buggy(request: ClientRequest) -> Any:
        body = Body()
        alive.append(weakref.ref(body))
        kept = None
        try:
            raise KeyError("bug")
        except KeyError as exc:
            kept = exc  # frame -> error -> traceback -> frame
        raise RuntimeError("a bug") from kept

    client, _ = app_with(buggy)
    gc.disable()
    try:
        resp = client.post("/openai/v1/chat/completions", data=b"{}", headers={"Authorization": "Bearer k"})
        assert resp.status_code == 500
        assert alive and alive[0]() is None  # freed at once, no collector needed
    finally:
        gc.enable()


def test_memory_is_given_back_only_after_a_large_body() -> None:
    from ezat_compat import memory

    assert memory.after_request_of(memory.TRIM_AFTER_BYTES - 1) is False
    assert memory.after_request_of(memory.TRIM_AFTER_BYTES) is (memory._trim is not None)
