"""Native Anthropic Messages on ``POST /v1/messages`` through the real gateway (gunicorn, gevent),
with the official ``anthropic`` SDK pointed at the gateway's base URL.

Bodies pass through unchanged except the model name (the deployment's ``upstream_model``), and
replies name the model as the client sent it; errors use Anthropic's envelope and statuses
(529 kept); streams pass through event by event with keep-alive; usage lands in the ledger
with the figures the client received.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx2
import pytest
import requests

from ezat_compat.domain import Deployment
from ezat_compat.routing import rendezvous_order
from tests.integration.harness import Gateway, ModelSpec, Sim, unscoped

pytestmark = pytest.mark.integration

KEEPALIVE_S = 0.25
SDK_VERSION_HEADER = "2026-10-21"  # what anthropic SDK 2.x sends as anthropic-version
SIM_FLAGS: dict[str, tuple[str, ...]] = {
    "native-a": (),
    "native-b": (),
    "down": ("--fail-status", "529", "--retry-after", "3"),
    "locked": ("--api-key", "not-the-gateways-key"),
}
LONG_SYSTEM = "You are a careful assistant who answers briefly. " * 120  # > 1024 tokens: cacheable


def _dep(name: str, urls: dict[str, str], upstream_model: str, priority: int = 0) -> dict[str, Any]:
    return {"name": name, "base_url": urls[name], "upstream_model": upstream_model, "priority": priority}


def _model(alias: str, *deployments: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id=f"anthropic/{alias}", aliases=(alias,), deployments=deployments)


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Sim]]:
    with ThreadPoolExecutor(len(SIM_FLAGS)) as pool:
        started = list(pool.map(lambda n: Sim(name=n, flags=SIM_FLAGS[n]).start(), SIM_FLAGS))
    servers = dict(zip(SIM_FLAGS, started, strict=True))
    yield servers
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(Sim.stop, servers.values()))


class RawUpstream(BaseHTTPRequestHandler):
    """An upstream that misbehaves at the protocol level, as the simulator can't: the last user
    text picks the fault. ``html-502``: a proxy's HTML error page. ``eof``: a 200 stream that
    ends cleanly (the connection closes) before ``message_stop``."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        fault = body["messages"][-1]["content"]
        if fault == "html-502":
            self._send(502, "text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>")
            return
        events = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_raw",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 5, "output_tokens": 1},
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Half an ans"}},
            ),
        ]
        self._send(
            200,
            "text/event-stream",
            b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events),
        )

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RawUpstream)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def closed_url() -> Iterator[str]:
    """A port that refuses connections: bound (so nobody else gets it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def gateway(
    sims: dict[str, Sim], raw_upstream: str, closed_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    s = {**{name: sim.url for name, sim in sims.items()}, "closed": closed_url}
    models = [
        _model("claude-native", _dep("native-a", s, "claude-upstream-a")),
        _model("claude-failover", _dep("down", s, "claude-down"), _dep("native-b", s, "claude-upstream-b", 1)),
        _model("claude-all-down", _dep("closed", s, "claude-closed"), _dep("down", s, "claude-down", 1)),
        _model("claude-locked", _dep("locked", s, "claude-locked")),
        _model("claude-session", _dep("native-a", s, "claude-upstream-a"), _dep("native-b", s, "claude-upstream-b")),
        _model("claude-raw", {"name": "raw", "base_url": raw_upstream, "upstream_model": "claude-raw"}),
    ]
    # Deployments never cool down here: each test sees every upstream answer as it is.
    server = Gateway(
        root=tmp_path_factory.mktemp("native"),
        models=models,
        gateway_settings={"keepalive_s": KEEPALIVE_S, "cooldown_failures": 100000, "max_cooldown_s": 0},
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> str:
    return gateway.new_key("native-org", balance="1000")


class Recorder:
    """An httpx client that keeps the requests the SDK sent (what the client really sent)."""

    def __init__(self) -> None:
        self.sent: list[httpx2.Request] = []
        self.received: list[httpx2.Response] = []
        self.http = httpx2.Client(event_hooks={"request": [self.sent.append], "response": [self.received.append]})

    def body(self, index: int = -1) -> dict[str, Any]:
        request = self.sent[index]
        request.read()
        return json.loads(request.content)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.http.close()


def sdk(gateway: Gateway, key: str, recorder: Recorder | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gateway.url, api_key=key, max_retries=0, http_client=recorder.http if recorder else None
    )


def post(
    gateway: Gateway,
    body: Any,
    key: str | None,
    *,
    headers: dict[str, str] | None = None,
    path: str = "/v1/messages",
    stream: bool = False,
) -> requests.Response:
    all_headers = {"content-type": "application/json", **(headers or {})}
    if key:
        all_headers["x-api-key"] = key
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(gateway.url + path, data=data, headers=all_headers, timeout=30, stream=stream)


def simple(model: str = "claude-native", text: str = "What is a prompt cache?", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": text}], **extra}


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return {**body, "model": model}


def usage_row(gateway: Gateway, request_id: str) -> dict[str, Any]:
    (row,) = [r for r in gateway.usage("--org", "native-org") if r["request_id"] == request_id]
    return row


def assert_same_usage(row: dict[str, Any], usage: Any) -> None:
    assert (row["input_tokens"], row["cache_write_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (
        usage.input_tokens,
        usage.cache_creation_input_tokens or 0,
        usage.cache_read_input_tokens or 0,
        usage.output_tokens,
    )


def assert_anthropic_error(resp: requests.Response, status: int, type_: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert body["type"] == "error" and set(body) <= {"type", "error", "request_id"}
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_
    assert body["error"]["message"]
    return body


def sse(resp: requests.Response) -> list[tuple[str, str]]:
    """(event, data) pairs of a native stream, pings included."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events: list[tuple[str, str]] = []
    name = ""
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, line.removeprefix("data: ")))
    return events


# ---------------------------------------------------------------- the round trip with the SDK


def test_messages_create_with_the_sdk(gateway: Gateway, key: str, clean: dict[str, Sim], recorder: Recorder) -> None:
    raw = sdk(gateway, key, recorder).messages.with_raw_response.create(
        model="claude-native",
        max_tokens=64,
        system="Answer in one sentence.",
        stop_sequences=["\n\n###"],
        metadata={"user_id": "user-7"},
        messages=[{"role": "user", "content": "Qu'est-ce qu'un cache de prompt ? ✓"}],
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.content and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "end_turn"

    (received,) = clean["native-a"].requests()
    assert received["path"] == "/v1/messages"
    assert received["body"] == with_model(recorder.body(), "claude-upstream-a")
    assert recorder.sent[-1].headers["anthropic-version"] == SDK_VERSION_HEADER  # the client's...
    assert received["headers"]["anthropic-version"] == "2023-06-01"  # ...never sent: the deployment's own
    assert received["headers"]["x-api-key"] == "sk-ant-test"  # the deployment's key…
    assert key not in json.dumps(received["headers"])  # …never the client's

    # The reply is the upstream's, as it came, but for the model: the name the client sent (the
    # same request sent to the simulator directly gets the same answer: the simulator is
    # deterministic but for the message id).
    assert message.model == "claude-native"
    direct = requests.post(
        clean["native-a"].url + "/v1/messages",
        json=received["body"],
        headers={"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"},
        timeout=10,
    ).json()
    assert direct["model"] == "claude-upstream-a"
    assert {**raw.http_response.json(), "id": "-"} == {**direct, "id": "-", "model": "claude-native"}


def test_messages_stream_with_the_sdk(gateway: Gateway, key: str, clean: dict[str, Sim], recorder: Recorder) -> None:
    with sdk(gateway, key, recorder).messages.stream(
        model="claude-native",
        max_tokens=128,
        messages=[{"role": "user", "content": "Tell me about streams [[sim:words=40]]"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        request_id = stream.response.headers["request-id"]
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    assert final.model == "claude-native"  # as sent, not the deployment's upstream_model
    sent = recorder.body()
    assert sent["stream"] is True
    assert clean["native-a"].bodies() == [with_model(sent, "claude-upstream-a")]
    assert_same_usage(usage_row(gateway, request_id), final.usage)


def test_explicit_stream_false_passes_through(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    body = simple(stream=False)
    resp = post(gateway, body, key)
    assert resp.status_code == 200, resp.text
    assert resp.json()["type"] == "message"
    assert clean["native-a"].bodies() == [with_model(body, "claude-upstream-a")]


def test_betas_are_forwarded_and_the_version_is_the_deployments(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    sdk(gateway, key).beta.messages.create(
        model="claude-native",
        max_tokens=32,
        betas=["context-management-2025-06-27", "fast-mode-2026-02-01"],
        messages=[{"role": "user", "content": "hi"}],
    )
    (received,) = clean["native-a"].requests()
    assert received["headers"]["anthropic-beta"] == "context-management-2025-06-27,fast-mode-2026-02-01"
    assert received["headers"]["anthropic-version"] == "2023-06-01"  # the deployment's, not the SDK's 2026-10-21
    # Without the client's headers, the deployment's anthropic_version is used too.
    assert post(gateway, simple(), key).status_code == 200
    received = clean["native-a"].requests()[-1]
    assert received["headers"]["anthropic-version"] == "2023-06-01" and "anthropic-beta" not in received["headers"]


def test_count_tokens_is_passed_to_the_upstream(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    messages = [{"role": "user", "content": "How many tokens is this sentence, roughly?"}]
    counted = sdk(gateway, key).messages.count_tokens(model="claude-native", system="Be brief.", messages=messages)
    (received,) = clean["native-a"].requests()
    assert received["path"] == "/v1/messages/count_tokens"
    assert received["body"] == {"model": "claude-upstream-a", "system": "Be brief.", "messages": messages}
    direct = requests.post(
        clean["native-a"].url + "/v1/messages/count_tokens",
        json=received["body"],
        headers={"x-api-key": "sk-ant-test"},
        timeout=10,
    ).json()
    assert counted.input_tokens == direct["input_tokens"] > 0


# ---------------------------------------------------------------- usage


def test_usage_of_native_requests_matches_what_the_client_received(gateway: Gateway, key: str) -> None:
    client = sdk(gateway, key)
    cached = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    rows = []
    for _ in range(2):  # the first writes the prompt cache, the second reads it
        raw = client.messages.with_raw_response.create(
            model="claude-native",
            max_tokens=32,
            system=cached,
            messages=[{"role": "user", "content": "Summarise the rules."}],
        )
        message = raw.parse()
        row = usage_row(gateway, raw.headers["request-id"])
        assert_same_usage(row, message.usage)
        assert row["endpoint"] == "messages" and row["model"] == "claude-native"
        assert row["canonical_model"] == "anthropic/claude-native" and row["deployment"] == "native-a"
        assert row["status"] == 200 and row["estimated"] is False and float(row["cost_usd"]) > 0
        rows.append(row)
    assert rows[0]["cache_write_tokens"] > 0 and rows[1]["cache_read_tokens"] == rows[0]["cache_write_tokens"]


# ---------------------------------------------------------------- errors


def test_our_own_errors_use_anthropics_envelope(gateway: Gateway, key: str) -> None:
    assert_anthropic_error(post(gateway, simple(), None), 401, "authentication_error")
    assert_anthropic_error(post(gateway, b"{not json", None), 401, "authentication_error")  # the key comes first
    assert_anthropic_error(post(gateway, simple(), None, path="/v1/messages/count_tokens"), 401, "authentication_error")
    assert_anthropic_error(post(gateway, simple(), "ezat_sk_not-a-real-key"), 401, "authentication_error")
    assert_anthropic_error(post(gateway, simple("gpt-9"), key), 404, "not_found_error")
    assert_anthropic_error(post(gateway, b"{not json", key), 400, "invalid_request_error")
    restricted = gateway.new_key("native-org", "--models", "anthropic/claude-session")
    assert_anthropic_error(post(gateway, simple(), restricted), 403, "permission_error")
    broke = gateway.new_key("native-broke-org", balance="0")
    assert_anthropic_error(post(gateway, simple(), broke), 402, "billing_error")
    limited = gateway.new_key("native-org", "--rpm", "1")
    assert post(gateway, simple(), limited).status_code == 200
    limited_resp = post(gateway, simple(), limited)
    assert_anthropic_error(limited_resp, 429, "rate_limit_error")
    assert int(limited_resp.headers["retry-after"]) >= 1


def raw_post(gateway: Gateway, key: str, fields: list[tuple[str, bytes]], body: dict[str, Any]) -> requests.Response:
    """A POST whose header field values go on the wire as the bytes given (``requests`` refuses
    some): the answer read back with ``requests``' own parsing of a raw response."""
    host, port = gateway.url.rsplit("/", 1)[1].rsplit(":", 1)
    data = json.dumps(body).encode()
    head = [b"POST /v1/messages HTTP/1.1", b"host: gateway", b"x-api-key: " + key.encode(), b"connection: close"]
    head += [b"content-type: application/json", b"content-length: %d" % len(data)]
    head += [name.encode() + b": " + value for name, value in fields]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, rest = answer.split(b"\r\n", 1)
    resp = requests.Response()
    resp.status_code = int(status_line.split()[1])
    head_text, resp._content = rest.split(b"\r\n\r\n", 1)
    resp.headers.update(line.decode("latin-1").split(": ", 1) for line in head_text.split(b"\r\n") if line)
    return resp


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param("anthropic-beta", b"\xa0fast-mode-2026-02-01", id="beta-leading-nbsp"),
        pytest.param("anthropic-beta", b"fast-mode-2026-02-01\xa0", id="beta-trailing-nbsp"),
        pytest.param("anthropic-version", b"\x85", id="version-only-nel"),
        pytest.param("anthropic-version", b"2023-06-01\x85", id="version-trailing-nel"),
    ],
)
def test_header_values_with_whitespace_http_does_not_know_are_a_400_never_a_500(
    gateway: Gateway, key: str, clean: dict[str, Sim], name: str, value: bytes
) -> None:
    resp = raw_post(gateway, key, [(name, value)], simple())
    body = assert_anthropic_error(resp, 400, "invalid_request_error")
    assert body["error"]["message"].startswith(f"{name}: the header's value must be visible ASCII characters")
    assert clean["native-a"].requests() == []


@pytest.mark.parametrize(
    "exc_type, status, make",
    [
        (anthropic.AuthenticationError, 401, lambda gw, key: sdk(gw, "ezat_sk_nope")),
        (anthropic.NotFoundError, 404, lambda gw, key: sdk(gw, key)),
    ],
    ids=["401", "404"],
)
def test_the_sdk_raises_its_own_exceptions(
    gateway: Gateway, key: str, exc_type: type[Exception], status: int, make: Any
) -> None:
    model = "gpt-9" if status == 404 else "claude-native"
    with pytest.raises(exc_type) as info:
        make(gateway, key).messages.create(model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(info.value, anthropic.APIStatusError) and info.value.status_code == status
    assert info.value.request_id  # read from our request-id header


def test_upstream_client_errors_pass_through_with_their_status(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    body = simple()
    del body["max_tokens"]
    resp = post(gateway, body, key)
    error = assert_anthropic_error(resp, 400, "invalid_request_error")
    assert error["error"]["message"] == "max_tokens: Field required"  # the upstream's own words
    assert error["request_id"] == resp.headers["request-id"]  # ours, not the upstream's
    assert len(clean["native-a"].bodies()) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    "max_tokens", ["64001", "9223372036854775807", "9" * 40], ids=["one-above", "int64-max", "past-int64"]
)
def test_max_tokens_above_the_models_limit_is_refused_before_the_upstream(
    gateway: Gateway, key: str, clean: dict[str, Sim], max_tokens: str, stream: bool
) -> None:
    raw = json.dumps(simple(stream=stream)).replace('"max_tokens": 64,', f'"max_tokens": {max_tokens},')
    assert max_tokens in raw
    resp = post(gateway, raw, key)
    error = assert_anthropic_error(resp, 400, "invalid_request_error")
    assert error["error"]["message"] == (
        f"max_tokens: {max_tokens} > 64000, which is the maximum allowed number of output tokens for claude-native"
    )
    assert clean["native-a"].bodies() == []
    assert post(gateway, simple(max_tokens=64000), key).status_code == 200  # the limit itself goes through


def test_529_is_kept_when_every_deployment_fails(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk(gateway, key).messages.create(
            model="claude-all-down", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert isinstance(info.value, anthropic.InternalServerError)
    assert info.value.status_code == 529
    assert info.value.response.headers["retry-after"] == "3"
    assert isinstance(info.value.body, dict) and info.value.body["error"]["type"] == "overloaded_error"
    assert info.value.request_id and info.value.body["request_id"] == info.value.request_id
    assert [b["model"] for b in clean["down"].bodies()] == ["claude-down"]  # the closed port was tried first
    # A stream that fails before its first event gets the same answer, as JSON.
    client = sdk(gateway, key)
    with (
        pytest.raises(anthropic.InternalServerError) as streamed,
        client.messages.stream(
            model="claude-all-down", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        stream.get_final_message()
    assert streamed.value.status_code == 529


def test_an_upstream_error_that_is_not_json_still_gets_the_envelope(gateway: Gateway, key: str) -> None:
    body = assert_anthropic_error(post(gateway, simple("claude-raw", "html-502"), key), 502, "api_error")
    assert "<html>" not in body["error"]["message"]


def test_a_deployment_refusing_the_gateways_key_is_not_the_clients_401(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    resp = post(gateway, simple("claude-locked"), key)
    body = assert_anthropic_error(resp, 500, "api_error")
    assert "gateway" in body["error"]["message"]
    assert len(clean["locked"].bodies()) == 1


# ---------------------------------------------------------------- failover and affinity


def test_failover_works_on_the_native_endpoint(
    gateway: Gateway, key: str, clean: dict[str, Sim], recorder: Recorder
) -> None:
    client = sdk(gateway, key, recorder)
    message = client.messages.create(
        model="claude-failover", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].type == "text" and message.content[0].text
    sent = recorder.body()
    assert clean["down"].bodies() == [with_model(sent, "claude-down")]
    assert clean["native-b"].bodies() == [with_model(sent, "claude-upstream-b")]

    with client.messages.stream(
        model="claude-failover", max_tokens=32, messages=[{"role": "user", "content": "stream it"}]
    ) as stream:
        assert "".join(stream.text_stream)
    assert [b.get("stream") for b in clean["down"].bodies()] == [None, True]
    assert [b.get("stream") for b in clean["native-b"].bodies()] == [None, True]


def test_the_session_header_keeps_a_conversation_on_one_deployment(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    names = ("native-a", "native-b")
    tier = [Deployment(name=n, base_url="http://unused", upstream_model="m") for n in names]
    expected = rendezvous_order(tier, "native-conversation-9")[0].name
    for _ in range(10):
        assert (
            post(
                gateway, simple("claude-session"), key, headers={"x-ezat-session": "native-conversation-9"}
            ).status_code
            == 200
        )
    assert {n: len(clean[n].bodies()) for n in names} == {n: 10 if n == expected else 0 for n in names}


# ---------------------------------------------------------------- streams


def test_a_stream_passes_through_event_by_event(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    body = simple(text="Stream this [[sim:words=30]]", stream=True)
    through = sse(post(gateway, body, key, stream=True))
    (received,) = clean["native-a"].bodies()
    assert received == with_model(body, "claude-upstream-a")
    direct = sse(
        requests.post(
            clean["native-a"].url + "/v1/messages",
            json=received,
            stream=True,
            timeout=10,
            headers={"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"},
        )
    )

    def normalised(events: list[tuple[str, str]]) -> list[tuple[str, Any]]:
        # The message id is the only thing the simulator draws at random.
        return [
            (name, {**json.loads(data), "message": {**json.loads(data)["message"], "id": "msg_-"}})
            if name == "message_start"
            else (name, data)
            for name, data in events
        ]

    # Event by event as the upstream sent them, but message_start names the model as sent.
    start = json.loads(through[0][1])
    assert through[0][0] == "message_start" and start["message"]["model"] == "claude-native"
    expected = normalised(direct)
    assert expected[0][1]["message"]["model"] == "claude-upstream-a"
    expected[0][1]["message"]["model"] = "claude-native"
    assert normalised(through) == expected
    assert [name for name, _ in through].count("content_block_delta") > 1


def test_keepalive_pings_while_the_upstream_is_silent(gateway: Gateway, key: str) -> None:
    resp = post(gateway, simple(text="think first [[sim:stall=1.5]]", stream=True), key, stream=True)
    events = sse(resp)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop" and "error" not in names
    ours = [data for name, data in events if name == "ping" and json.loads(data) == {"type": "ping"}]
    assert len(ours) >= 1 + 3  # the upstream's own ping, then ours every 0.25 s of the 1.5 s stall
    # Every other event is the upstream's, in Anthropic's order.
    assert names.index("content_block_start") > names.index("ping")


def test_the_sdk_reads_a_stream_with_keepalive_pings(gateway: Gateway, key: str) -> None:
    with sdk(gateway, key).messages.stream(
        model="claude-native", max_tokens=64, messages=[{"role": "user", "content": "hello [[sim:stall=1]]"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text and final.stop_reason == "end_turn"


def test_a_stream_broken_mid_way_ends_with_an_error_event(gateway: Gateway, key: str, clean: dict[str, Sim]) -> None:
    resp = post(gateway, simple("claude-failover", "tell me more [[sim:cut=4]]", stream=True), key, stream=True)
    events = sse(resp)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names
    error = json.loads(events[-1][1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    # It had started: no failover (down refused it first, native-b served it, nobody else).
    assert len(clean["native-b"].bodies()) == 1 and len(clean["down"].bodies()) == 1
    (row,) = [r for r in gateway.usage("--org", "native-org") if r["request_id"] == resp.headers["request-id"]]
    assert row["status"] >= 500 and Decimal(row["cost_usd"]) == 0


def test_a_stream_that_ends_early_ends_with_an_error_event(gateway: Gateway, key: str) -> None:
    events = sse(post(gateway, simple("claude-raw", "eof", stream=True), key, stream=True))
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert names[-1] == "error", names


# ---------------------------------------------------------------- images and PDFs the API can't read


def _png(pixels: bytes | None = None, side: int = 16) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">II5B", side, side, 8, 2, 0, 0, 0)
    idat = pixels if pixels is not None else zlib.compress(b"\0" * ((side * 3 + 1) * side))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _with_blocks(*blocks: dict[str, Any]) -> dict[str, Any]:
    return simple(messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, *blocks]}])


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("block", "message"),
    [
        pytest.param(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": _b64(_png(b"\x13" * 900))},
            },
            "messages.0.content.1.image.source.base64: the image could not be decoded",
            id="png-random-idat",
        ),
        pytest.param(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": _b64(b"\xff\xd8\xff\xe0")},
            },
            "messages.0.content.1.image.source.base64: The image was specified using the image/png media type, "
            "but the image appears to be a image/jpeg image",
            id="jpeg-labelled-png",
        ),
        pytest.param(
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": _b64(b"<html>")},
            },
            "messages.0.content.1.pdf.source.base64.data: The PDF specified was not valid.",
            id="pdf-that-is-html",
        ),
    ],
)
def test_an_image_or_pdf_the_api_cannot_read_is_refused_before_the_upstream(
    gateway: Gateway, key: str, clean: dict[str, Sim], block: dict[str, Any], message: str
) -> None:
    resp = post(gateway, _with_blocks(block), key)
    error = assert_anthropic_error(resp, 400, "invalid_request_error")
    assert error["error"]["message"].startswith(message), error
    assert clean["native-a"].bodies() == []
    good = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(_png())}}
    assert post(gateway, _with_blocks(good), key).status_code == 200  # a PNG that decodes goes through
    sent = clean["native-a"].bodies()[-1]["messages"][0]["content"][1]
    assert sent == good  # as the client sent it: it fits, so it is not re-encoded


# ---------------------------------------------------------------- message threads (beta)

THREADS_BETA = "message-threads-2026-08-12"


def _turns_sent(recorder: Recorder) -> list[dict[str, Any]]:
    return [recorder.body(i) for i in range(len(recorder.sent))]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_sdk_thread_runs_turn_after_turn_the_gateway_holding_the_conversation(
    gateway: Gateway, key: str, clean: dict[str, Sim], recorder: Recorder, stream: bool
) -> None:
    """``client.beta.messages.thread()`` with its defaults (``unsupported_request_behavior`` "error":
    any thread refusal would raise): the SDK sends a create, then continues that send only the new
    messages and no ``system``; the upstream gets each turn whole, without ``thread`` or the beta,
    and every turn has its ledger row."""
    client = sdk(gateway, key, recorder)
    thread = client.beta.messages.thread(model="claude-native", max_tokens=64, system=LONG_SYSTEM)
    replies = []
    for text in ("first question", "second question", "third question"):
        if stream:
            with thread.stream({"role": "user", "content": text}) as events:
                replies.append(events.get_final_message())
        else:
            replies.append(thread.send({"role": "user", "content": text}))
    assert all(r.stop_reason == "end_turn" and r.model == "claude-native" for r in replies)
    sent = _turns_sent(recorder)
    assert [b["thread"] for b in sent] == [
        {"type": "create"},
        {"type": "continue", "previous_message_id": replies[0].id},
        {"type": "continue", "previous_message_id": replies[1].id},
    ]
    assert [len(b["messages"]) for b in sent] == [1, 1, 1] and "system" not in sent[2]
    assert all(THREADS_BETA in r.headers["anthropic-beta"] for r in recorder.sent)

    received = clean["native-a"].requests()
    assert len(received) == 3
    for got in received:
        assert "thread" not in got["body"] and THREADS_BETA not in got["headers"].get("anthropic-beta", "")
    # the create has no breakpoint (nothing to cache: it goes as sent); the continues have one at
    # the history's end, so they start with the organisation's cache scope
    assert received[0]["body"]["system"] == LONG_SYSTEM
    assert all(unscoped(got["body"])["system"] == [{"type": "text", "text": LONG_SYSTEM}] for got in received[1:])
    last = received[2]["body"]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in last if m["role"] == "user"] == [
        "first question",
        "second question",
        "third question",
    ]
    assert last[3]["content"][-1]["text"] == replies[1].content[-1].text  # the reply as the client got it
    assert last[3]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # the history is read from the cache
    assert received[2]["body"]["model"] == "claude-upstream-a"
    assert [usage_row(gateway, r.headers["request-id"])["status"] for r in recorder.received] == [200, 200, 200]
    assert thread.previous_message_id == replies[2].id


def test_an_sdk_tool_runner_on_a_thread_runs_its_tool_loop(
    gateway: Gateway, key: str, clean: dict[str, Sim], recorder: Recorder
) -> None:
    """The tool runner sends the tool result as a continue; the upstream gets the tool_use and
    its result in one whole request."""
    calls: list[str] = []

    @anthropic.beta_tool
    def lookup(city: str) -> str:
        """Look a city up.

        Args:
            city: the city
        """
        calls.append(city)
        return "sunny"

    client = sdk(gateway, key, recorder)
    thread = client.beta.messages.thread(
        model="claude-native",
        max_tokens=64,
        tools=[lookup],
        messages=[{"role": "user", "content": "use the tool please"}],
    )
    final = None
    for message in thread.tool_runner():
        final = message
    assert calls and final is not None and final.stop_reason == "end_turn"
    sent = _turns_sent(recorder)
    assert [b["thread"]["type"] for b in sent] == ["create", "continue"]
    assert [m["content"][0]["type"] for m in sent[1]["messages"]] == ["tool_result"] and "tools" not in sent[1]
    bodies = clean["native-a"].bodies()
    assert len(bodies) == 2
    second = bodies[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"][-1]["type"] == "tool_use"
    assert second[2]["content"][0]["type"] == "tool_result"
    assert second[2]["content"][0]["tool_use_id"] == second[1]["content"][-1]["id"]
    assert [t["name"] for t in bodies[1]["tools"]] == ["lookup"]


def test_a_thread_the_gateway_doesnt_hold_is_thread_not_found_before_any_upstream_call(
    gateway: Gateway, key: str, clean: dict[str, Sim]
) -> None:
    """Unknown, expired or another organisation's: 404 ``thread_not_found``, which the SDKs answer
    by resending the whole history under a new thread; nothing held, nothing billed."""
    created = post(gateway, simple(thread={"type": "create"}), key, headers={"anthropic-beta": THREADS_BETA})
    assert created.status_code == 200, created.text
    other = gateway.new_key("native-other-org", balance="10")
    for previous, who in (("msg_01XYZ", key), (created.json()["id"], other)):
        resp = post(
            gateway,
            simple(thread={"type": "continue", "previous_message_id": previous}),
            who,
            headers={"anthropic-beta": THREADS_BETA},
        )
        assert resp.status_code == 404, resp.text
        body = resp.json()
        assert body["error"]["type"] == "not_found_error"
        assert body["error"]["details"] == {"error_code": "thread_not_found"}
        assert [r for r in gateway.usage("--org", "native-org") if r["request_id"] == resp.headers["request-id"]] == []
    assert len(clean["native-a"].requests()) == 1  # the create only
