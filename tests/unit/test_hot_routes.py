"""``api.hot.HotRoutes``: the two hot routes answered as the Flask app's views, hooks and error
handlers answer them; every other request goes to the app untouched."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from werkzeug.datastructures import EnvironHeaders
from werkzeug.test import Client

from ezat_compat.api.hot import HotRoutes, WSGIHeaders, status_line
from ezat_compat.dialects.anthropic_messages import AnthropicMessages
from ezat_compat.dialects.openai_chat import OpenAIChat
from ezat_compat.errors import GatewayError, InvalidRequestError
from ezat_compat.logs import Outages, RequestLog, RequestRecord
from ezat_compat.metrics import Metrics
from ezat_compat.pipeline import ClientRequest, Reply
from ezat_compat.readiness import Readiness
from tests.unit.test_pipeline import CONFIG

ROUTES = {
    "/openai/v1/chat/completions": (OpenAIChat(), "openai.chat_completions"),
    "/v1/messages": (AnthropicMessages(), "anthropic.messages"),
}


class FakeGateway:
    """``handle`` runs ``answer`` on what the middleware hands the pipeline."""

    config = CONFIG

    def __init__(self, answer: Callable[[ClientRequest], Any]) -> None:
        self.answer = answer
        self.requests: list[ClientRequest] = []

    def handle(self, dialect: Any, request: ClientRequest) -> Any:
        self.requests.append(request)
        return self.answer(request)


def app_behind(answer: Callable[[ClientRequest], Any], metrics_only: Callable[..., bool] | None = None) -> Any:
    finished: list[RequestRecord] = []
    request_log = RequestLog(Metrics(CollectorRegistry()), logger=logging.getLogger("test.hot.access"))
    sink = request_log.finish

    def finish(record: RequestRecord) -> None:
        finished.append(record)
        sink(record)

    request_log.finish = finish  # type: ignore[method-assign]
    readiness = Readiness("sqlite://", "", Outages(logging.getLogger("test.hot")))

    def flask_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("418 I'M A TEAPOT", [("Content-Type", "text/plain")])
        return [b"the app: " + environ["REQUEST_METHOD"].encode() + b" " + environ["PATH_INFO"].encode()]

    gw = FakeGateway(answer)
    hot = HotRoutes(flask_app, gw, request_log, readiness, ROUTES, metrics_only)  # type: ignore[arg-type]
    return Client(hot), gw, finished


def test_a_reply_is_the_json_body_with_the_request_id_headers_and_its_log_record() -> None:
    client, gw, finished = app_behind(lambda r: Reply(b'{"ok":true}'))
    resp = client.post("/openai/v1/chat/completions", data=b'{"model":"m"}', headers={"Authorization": "Bearer sk-1"})
    assert (resp.status_code, resp.data, resp.headers["content-type"]) == (200, b'{"ok":true}', "application/json")
    assert resp.headers["content-length"] == "11"
    (request,) = gw.requests
    assert resp.headers["request-id"] == resp.headers["x-request-id"] == request.request_id
    assert request.api_key == "sk-1" and request.read_body() == b'{"model":"m"}'
    assert request.headers.get("AUTHORIZATION") == "Bearer sk-1"  # looked up in any case
    ((record),) = finished
    assert (record.request_id, record.method, record.path, record.view, record.status) == (
        request.request_id,
        "POST",
        "/openai/v1/chat/completions",
        "openai.chat_completions",
        200,
    )


def test_the_key_may_come_as_x_api_key() -> None:
    client, gw, _ = app_behind(lambda r: Reply(b"{}"))
    client.post("/v1/messages", data=b"{}", headers={"x-api-key": " sk-2 "})
    assert gw.requests[0].api_key == "sk-2"


@pytest.mark.parametrize(
    ("path", "status", "envelope"),
    [("/openai/v1/chat/completions", 400, "openai"), ("/v1/messages", 400, "anthropic")],
)
def test_a_gateway_error_is_rendered_in_the_dialects_envelope(path: str, status: int, envelope: str) -> None:
    def refuse(_r: ClientRequest) -> Any:
        raise InvalidRequestError("messages: Field required", param="messages")

    client, _, finished = app_behind(refuse)
    resp = client.post(path, data=b"{}")
    assert resp.status_code == status
    body = json.loads(resp.data)
    if envelope == "openai":
        assert body["error"]["message"] == "messages: Field required" and body["error"]["param"] == "messages"
    else:
        assert body["type"] == "error" and body["request_id"] == resp.headers["request-id"]
    assert finished[0].status == status and finished[0].error == "InvalidRequestError"


def test_an_unexpected_error_is_a_500_that_quotes_the_request_id_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bug(_r: ClientRequest) -> Any:
        raise RuntimeError("/srv/secret/path.py exploded")

    client, _, finished = app_behind(bug)
    with caplog.at_level(logging.ERROR, logger="ezat_compat"):
        resp = client.post("/openai/v1/chat/completions", data=b"{}")
    rid = resp.headers["request-id"]
    assert resp.status_code == 500
    message = json.loads(resp.data)["error"]["message"]
    assert message == f"The gateway failed to process the request; quote request id {rid} to support."
    assert "secret" not in resp.data.decode()
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)
    assert finished[0].status == 500 and finished[0].error == "GatewayError"


def test_a_5xx_gateway_error_keeps_its_status() -> None:
    def overloaded(_r: ClientRequest) -> Any:
        raise GatewayError("upstream exploded")

    client, _, _ = app_behind(overloaded)
    assert client.post("/v1/messages", data=b"{}").status_code == 500


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/openai/v1/chat/completions"),
        ("HEAD", "/v1/messages"),
        ("POST", "/openai/v1/chat/completions/"),
        ("POST", "/openai/v1/responses"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/healthz"),
    ],
)
def test_every_other_request_goes_to_the_app(method: str, path: str) -> None:
    client, gw, finished = app_behind(lambda r: Reply(b"{}"))
    resp = client.open(path, method=method)
    assert resp.status_code == 418 and gw.requests == [] and finished == []


def test_on_the_metrics_listener_even_a_hot_route_goes_to_the_app() -> None:
    client, gw, _ = app_behind(lambda r: Reply(b"{}"), metrics_only=lambda environ: True)
    assert client.post("/openai/v1/chat/completions", data=b"{}").status_code == 418 and gw.requests == []


def test_a_body_over_the_limit_is_a_413_before_it_is_read() -> None:
    def read(r: ClientRequest) -> Any:
        r.read_body()
        return Reply(b"{}")

    client, _, _ = app_behind(read)
    resp = client.post(
        "/openai/v1/chat/completions", data=b"{}", environ_overrides={"CONTENT_LENGTH": str(CONFIG.max_body_bytes + 1)}
    )
    assert resp.status_code == 413 and json.loads(resp.data)["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(("code", "line"), [(200, "200 OK"), (429, "429 TOO MANY REQUESTS"), (529, "529 UNKNOWN")])
def test_status_lines_are_werkzeugs(code: int, line: str) -> None:
    assert status_line(code) == line


class FakeSession:
    """Enough of a ``StreamSession`` for the body that wraps it: it is closed once, at the end."""

    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_stream_whose_headers_cannot_be_sent_is_still_closed_so_it_settles() -> None:
    session = FakeSession()
    _, gw, _ = app_behind(lambda r: session)
    hot = HotRoutes(  # the same middleware, called with a server whose start_response fails
        lambda e, s: [],
        gw,
        RequestLog(Metrics(CollectorRegistry())),
        Readiness("sqlite://", "", Outages(logging.getLogger("t"))),
        ROUTES,  # type: ignore[arg-type]
    )

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        raise OSError("the client is gone")

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/messages", "wsgi.input": None, "CONTENT_LENGTH": "0"}
    with pytest.raises(OSError):
        hot(environ, start_response)
    assert session.closed == 1


@pytest.mark.parametrize(
    "name",
    [
        "authorization",
        "Authorization",
        "X-API-KEY",
        "x-api-key",
        "x-ezat-session",
        "X_Ezat_Cache",
        "content-type",
        "Content-Length",
        "anthropic-version",
        "anthropic-beta",
        "absent",
        "accept",
    ],
)
def test_wsgi_headers_read_what_werkzeug_reads(name: str) -> None:
    environ = {
        "HTTP_AUTHORIZATION": "Bearer k",
        "HTTP_X_API_KEY": " key ",
        "HTTP_X_EZAT_SESSION": "s-1",
        "HTTP_X_EZAT_CACHE": "off",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "12",
        "HTTP_ANTHROPIC_VERSION": "2023-06-01",
        "HTTP_CONTENT_TYPE": "not this one",
        "REQUEST_METHOD": "POST",
    }
    for _ in range(2):  # the environ key worked out, then remembered
        assert WSGIHeaders(environ).get(name) == EnvironHeaders(environ).get(name)
        assert WSGIHeaders(environ).get(name, "d") == EnvironHeaders(environ).get(name, "d")


def test_the_lazy_responses_dialect_renders_errors_before_it_is_built() -> None:
    from flask import Flask

    from ezat_compat.api.responses import LazyResponses

    lazy = LazyResponses(Flask("t"))  # no gateway in it: the dialect can't be built
    err = InvalidRequestError("input: bad", param="input")
    assert lazy.render_error(err, "r1") == OpenAIChat().render_error(err, "r1")
    with pytest.raises(KeyError):
        _ = lazy.endpoint  # everything else is the built dialect's


def test_the_lazy_responses_dialect_looks_each_attribute_up_once() -> None:
    """An attribute found on the built dialect is kept: a request's later lookups (several a
    request) don't build or find the dialect again."""
    from flask import Flask

    from ezat_compat.api import responses as responses_api

    app = Flask("t")
    first, second = SimpleNamespace(endpoint="responses"), SimpleNamespace(endpoint="other")
    app.extensions[responses_api._EXTENSION] = first
    lazy = responses_api.LazyResponses(app)
    assert lazy.endpoint == "responses"
    app.extensions[responses_api._EXTENSION] = second
    assert lazy.endpoint == "responses" and "endpoint" in vars(lazy)
