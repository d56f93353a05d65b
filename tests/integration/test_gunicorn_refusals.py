"""gunicorn's own refusals (a request it can't parse, headers over its limits), answered before
the app sees the request, come in the JSON envelope of the dialect the path names, with
gunicorn's status and reason, through the real gunicorn (``server/worker.py``)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ezat_compat.server.worker import error_answer, status_of
from tests.integration.harness import Gateway, ModelSpec, Sim

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    sim = Sim(name="refusals").start()
    model = ModelSpec(
        id="anthropic/claude-x",
        aliases=("claude-x",),
        deployments=({"name": "a", "base_url": sim.url, "upstream_model": "claude-x"},),
    )
    gw = Gateway(root=Path(tmp_path_factory.mktemp("refusals")), models=(model,)).start()
    yield gw
    gw.stop()
    sim.stop()


def exchange(gateway: Gateway, raw: bytes) -> tuple[int, str, dict[str, str], bytes]:
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    _, status, reason = lines[0].split(" ", 2)
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(status), reason, headers, body


def test_a_request_line_gunicorn_cannot_parse_is_a_json_400(gateway: Gateway) -> None:
    status, reason, headers, body = exchange(gateway, b"NOT A REQUEST LINE AT ALL\r\n\r\n")
    assert (status, reason) == (400, "Bad Request")
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] is None and error["code"] is None
    assert error["message"].startswith("Bad Request: ")


def test_headers_over_gunicorns_limit_are_a_json_431(gateway: Gateway) -> None:
    huge = b"x-big: " + b"a" * 9000 + b"\r\n"
    status, reason, headers, body = exchange(
        gateway, b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n"
    )
    assert (status, reason) == (431, "Request Header Fields Too Large")
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_an_invalid_header_on_the_native_route_gets_anthropics_envelope(gateway: Gateway) -> None:
    """Two Content-Lengths that disagree: gunicorn refuses the request it has read the path of."""
    status, _, headers, body = exchange(
        gateway, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    )
    assert status == 400
    assert headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert set(answer["error"]) == {"type", "message"}


def test_the_app_still_answers_on_the_same_server(gateway: Gateway) -> None:
    status, _, headers, _ = exchange(gateway, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [("/v1/messages", True), ("/v1/messages/count_tokens", True), ("/v1/messagesx", False), (None, False)],
)
def test_the_envelope_follows_the_path(path: str | None, anthropic: bool) -> None:
    answer = error_answer(400, "Bad Request", "Invalid header", path)
    assert status_of(answer) == (400, "Bad Request")
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert ("type" in body and body["error"]["type"] == "invalid_request_error") is anthropic
    assert body["error"]["message"] == "Bad Request: Invalid header"


def test_a_server_error_says_nothing_of_its_cause() -> None:
    body = json.loads(error_answer(500, "Internal Server Error", "", None).partition(b"\r\n\r\n")[2])
    assert body == {"error": {"message": "Internal Server Error", "type": "server_error", "param": None, "code": None}}
