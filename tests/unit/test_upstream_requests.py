"""The upstream client on ``requests``, in process with ``responses``: failover through the
gateway's loop, the exception map, what the client is told, and the operator's egress settings
(proxies, CAs, client certificates) reaching the call."""

from __future__ import annotations

import datetime
import json
import logging
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import responses
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ezat_compat.catalog import Catalog
from ezat_compat.config import ConfigError, parse_config
from ezat_compat.cooldowns import LocalCooldowns, Policy
from ezat_compat.domain import Deployment
from ezat_compat.errors import (
    GatewayError,
    InvalidRequestError,
    UpstreamConnectError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
    UpstreamTLSError,
)
from ezat_compat.failures import client_error
from ezat_compat.pipeline import Call, Gateway
from ezat_compat.server.metrics import Metrics
from ezat_compat.upstream.client import UpstreamClient
from ezat_compat.upstream.egress import (
    ANSWER_READ_BUFFER,
    CHECKED_POOLS,
    TLSAdapter,
    check_files,
    describe,
    egress_of,
    masked,
)
from tests.support.environment import without_proxy_variables
from tests.support.pipeline import AUTH

MESSAGE = {
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
CONFIG = parse_config(
    {
        "models": [
            {
                "id": "anthropic/m",
                "aliases": ["m"],
                "price": {"input": 3, "output": 15},
                "deployments": [
                    {"name": "a", "base_url": "http://a.test", "upstream_model": "ma"},
                    {"name": "b", "base_url": "http://b.test", "upstream_model": "mb"},
                ],
            }
        ],
    },
    environ={"ANTHROPIC_API_KEY": "sk-up"},
)


def client() -> UpstreamClient:
    return UpstreamClient(connect_timeout_s=2, stream_idle_timeout_s=5)


def deployment(**egress: Any) -> Deployment:
    return Deployment(name="a", base_url="http://a.test", upstream_model="ma", api_key="sk-up", **egress)


class _Nothing:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"not used here: {name}")


def gateway(upstream: UpstreamClient) -> Gateway:
    return Gateway(
        CONFIG,
        catalog=Catalog(CONFIG.models),
        accounts=_Nothing(),  # type: ignore[arg-type]
        ledger=_Nothing(),  # type: ignore[arg-type]
        limits=_Nothing(),  # type: ignore[arg-type]
        cooldowns=LocalCooldowns(Policy.make(failures=1, cooldown_s=30, max_cooldown_s=300)),
        upstream=upstream,
        images=_Nothing(),  # type: ignore[arg-type]
        metrics=Metrics(),
        thinking=_Nothing(),  # type: ignore[arg-type]
        rand=lambda: 0.0,
    )


@responses.activate
def test_a_529_then_a_200_fails_over() -> None:
    responses.post("http://a.test/v1/messages", json=OVERLOADED, status=529)
    responses.post("http://b.test/v1/messages", json=MESSAGE)
    gw = gateway(client())
    call = Call("r1", "chat.completions", AUTH, CONFIG.models[0], "m", None, 0, time.monotonic())
    data, _ = gw.complete(call, "/v1/messages", b'{"max_tokens":1}')
    assert json.loads(data) == MESSAGE and call.attempts == ["a", "b"]
    assert [json.loads(c.request.body)["model"] for c in responses.calls] == ["ma", "mb"]


@pytest.mark.parametrize(
    ("raised", "expected", "failover"),
    [
        pytest.param(requests.exceptions.ReadTimeout("read timed out"), UpstreamTimeoutError, True, id="timeout"),
        pytest.param(requests.exceptions.ConnectTimeout("connect"), UpstreamConnectError, True, id="connect-timeout"),
        pytest.param(
            requests.exceptions.ConnectionError(ConnectionResetError(104, "reset")),
            UpstreamConnectError,
            True,
            id="reset",
        ),
        pytest.param(requests.exceptions.ProxyError("407"), UpstreamConnectError, True, id="proxy"),
        pytest.param(
            requests.exceptions.SSLError(ssl.SSLCertVerificationError(1, "certificate verify failed")),
            UpstreamTLSError,
            True,
            id="tls",
        ),
    ],
)
@responses.activate
def test_the_exception_map(raised: Exception, expected: type[Exception], failover: bool) -> None:
    responses.post("http://a.test/v1/messages", body=raised)
    with pytest.raises(expected) as info:
        client().complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    assert info.value.failover is failover  # type: ignore[attr-defined]


@responses.activate
def test_a_certificate_that_cannot_be_verified_is_a_500_that_says_so(caplog: pytest.LogCaptureFixture) -> None:
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    error.verify_message = "unable to get local issuer certificate"
    responses.post("http://a.test/v1/messages", body=requests.exceptions.SSLError(error))
    with caplog.at_level(logging.ERROR, logger="ezat_compat"), pytest.raises(UpstreamTLSError) as info:
        client().complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    told = client_error(info.value)
    assert type(told) is GatewayError and told.status == 500 and told.openai_type == "server_error"
    assert "certificate could not be verified" in told.message
    line = next(r.getMessage() for r in caplog.records if "TLS" in r.getMessage())
    assert "deployment a" in line and "a.test" in line and "unable to get local issuer certificate" in line


@pytest.mark.parametrize("status", [400, 403, 407, 413, 422])
@responses.activate
def test_a_4xx_that_is_not_the_apis_error_is_never_the_clients_fault(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    responses.post("http://a.test/v1/messages", body=b"<html>Access denied by proxy</html>", status=status)
    with caplog.at_level(logging.WARNING, logger="ezat_compat"), pytest.raises(UpstreamStatusError) as info:
        client().complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    assert info.value.failover
    told = client_error(info.value)
    assert type(told) is GatewayError and told.status == 500 and told.upstream is None
    assert "Access denied" not in told.message  # the page is logged, not shown
    assert any(f"HTTP {status}" in r.getMessage() and "Access denied" in r.getMessage() for r in caplog.records)


@responses.activate
def test_the_apis_own_400_stays_the_clients() -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}
    responses.post("http://a.test/v1/messages", json=body, status=400)
    with pytest.raises(UpstreamStatusError) as info:
        client().complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    assert not info.value.failover and isinstance(client_error(info.value), InvalidRequestError)


@responses.activate
def test_a_stream_is_read_with_its_events_in_order() -> None:
    body = (
        b'event: message_start\ndata: {"type":"message_start"}\n\n'
        b"event: ping\ndata: {}\n\n"
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    responses.post("http://a.test/v1/messages", body=body, content_type="text/event-stream")
    stream = client().open_stream(deployment(), "/v1/messages", b"{}", first_event_timeout_s=5)
    try:
        assert [e for e, _ in stream.events()] == ["message_start", "ping", "message_stop"]
        assert stream.ended
    finally:
        stream.close()
    assert responses.calls[0].request.headers["accept"] == "text/event-stream"


@responses.activate
def test_a_stream_that_is_refused_raises_its_status_when_read() -> None:
    responses.post("http://a.test/v1/messages", json=OVERLOADED, status=529)
    stream = client().open_stream(deployment(), "/v1/messages", b"{}", first_event_timeout_s=5)
    with pytest.raises(UpstreamStatusError) as info:
        stream.first()
    stream.close()
    assert info.value.status_code == 529 and info.value.failover


@responses.activate
def test_a_stream_cut_in_the_middle_of_an_event_drops_the_half_event() -> None:
    body = b'event: message_start\ndata: {"type":"message_start"}\n\nevent: content_block_delta\ndata: {"ty'
    responses.post("http://a.test/v1/messages", body=body, content_type="text/event-stream")
    stream = client().open_stream(deployment(), "/v1/messages", b"{}", first_event_timeout_s=5)
    try:
        assert [e for e, _ in stream.events()] == ["message_start"]
    finally:
        stream.close()


@pytest.mark.parametrize(
    ("chunks", "hand_offs"),
    [
        pytest.param([b"data: 1\n\ndata: 2\n\ndata: 3\n\n"], [["1", "2", "3"]], id="one-read-one-hand-off"),
        pytest.param([b"data: 1\n\ndata: 2\n\n", b"data: 3\n\n"], [["1", "2"], ["3"]], id="a-hand-off-per-read"),
        pytest.param([b"data: 1\n\ndata: ", b"2\n\n"], [["1"], ["2"]], id="an-event-split-across-reads"),
        pytest.param([b"data: 1\n", b"\n"], [["1"]], id="its-end-in-the-next-read"),
        pytest.param([b": ping\n\n", b"data: 1\n\n"], [["1"]], id="a-read-with-no-event-hands-on-nothing"),
    ],
)
def test_the_events_of_one_read_are_handed_on_together(chunks: list[bytes], hand_offs: list[list[str]]) -> None:
    """``before_read`` comes after every complete event of the reads so far: the reader hands
    the writer one batch a read (upstream/client.py ``UpstreamStream._read``)."""
    from ezat_compat.upstream.sse import iter_sse

    batches: list[list[str]] = []
    batch: list[str] = []

    def hand_on() -> None:
        nonlocal batch
        if batch:
            batches.append(batch)
            batch = []

    for _, data in iter_sse(chunks, before_read=hand_on):
        batch.append(data)
    hand_on()
    assert batches == hand_offs


@responses.activate
def test_an_upstreams_cookies_never_ride_along() -> None:
    """A cookie one organisation's call was given is never sent on another call."""
    responses.post("http://a.test/v1/messages", json=MESSAGE, headers={"set-cookie": "sid=org-a; Path=/"})
    upstream = client()
    upstream.complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    upstream.complete(deployment(), "/v1/messages", b"{}", timeout_s=5)
    assert [call.request.headers.get("cookie") for call in responses.calls] == [None, None]
    assert not upstream.session.cookies


@responses.activate
def test_deployments_of_one_name_in_two_models_keep_their_own_model_and_key() -> None:
    """Names are unique per model only (the demo names each model's deployment ``simulator``):
    each call goes out with its own deployment's upstream model and key, whichever went first."""
    responses.post("http://a.test/v1/messages", json=MESSAGE)
    sonnet = Deployment(name="simulator", base_url="http://a.test", upstream_model="claude-sonnet", api_key="k1")
    opus = Deployment(name="simulator", base_url="http://a.test", upstream_model="claude-opus", api_key="k2")
    upstream = client()
    for dep in (sonnet, opus, sonnet):
        body, headers = upstream.shape(dep, b"{}")
        upstream.complete(dep, "/v1/messages", body, timeout_s=5, headers=headers)
    sent = [(json.loads(call.request.body)["model"], call.request.headers["x-api-key"]) for call in responses.calls]
    assert sent == [("claude-sonnet", "k1"), ("claude-opus", "k2"), ("claude-sonnet", "k1")]


@responses.activate
def test_a_header_value_requests_refuses_is_an_upstream_failure_not_a_crash() -> None:
    """The request is prepared inside the call's error handling: a header value ``requests``
    won't send (a line break) is a failed attempt like a broken socket, and nothing is sent."""
    responses.post("http://a.test/v1/messages", json=MESSAGE)
    with pytest.raises(UpstreamConnectError):
        client().complete(deployment(), "/v1/messages", b"{}", timeout_s=5, headers={"anthropic-beta": "a\r\nx: y"})
    assert len(responses.calls) == 0


def test_an_event_larger_than_the_cap_breaks_the_stream() -> None:
    from ezat_compat.upstream.sse import iter_sse

    with pytest.raises(UpstreamStreamError, match="larger than 100 bytes"):
        list(iter_sse([b"data: " + b"x" * 60, b"x" * 60], max_event_bytes=100))


# ---------------------------------------------------------------- the egress settings reach the call


@pytest.mark.parametrize(
    ("environment", "setting", "expected"),
    [
        pytest.param(
            {"HTTP_PROXY": "http://env-proxy:3128"}, None, {"http": "http://env-proxy:3128"}, id="environment"
        ),
        pytest.param({"http_proxy": "http://env-proxy:3128"}, None, {"http": "http://env-proxy:3128"}, id="lower-case"),
        pytest.param({"HTTP_PROXY": "http://env-proxy:3128", "NO_PROXY": "a.test"}, None, {}, id="no-proxy-bypasses"),
        pytest.param(
            {"HTTP_PROXY": "http://env-proxy:3128"},
            "http://u:p@mine:3128",
            {"http": "http://u:p@mine:3128", "https": "http://u:p@mine:3128"},
            id="deployment-wins",
        ),
        pytest.param({"HTTP_PROXY": "http://env-proxy:3128"}, "", {}, id="empty-means-none"),
    ],
)
@responses.activate
def test_the_proxy_reaches_the_call(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], setting: str | None, expected: dict[str, str]
) -> None:
    without_proxy_variables(monkeypatch)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    responses.post("http://a.test/v1/messages", json=MESSAGE)
    client().complete(deployment(proxy=setting), "/v1/messages", b"{}", timeout_s=5)
    sent = responses.calls[0].request.req_kwargs  # type: ignore[attr-defined]
    assert {k: v for k, v in sent["proxies"].items() if k in ("http", "https")} == expected
    assert sent["verify"] is True and sent["stream"] is True


def _ca(folder: Path, name: str) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _subjects(context: ssl.SSLContext) -> set[str]:
    return {dict(item[0] for item in c["subject"]).get("commonName", "") for c in context.get_ca_certs()}


def test_ca_files_are_trusted_besides_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    mine, everyone = _ca(tmp_path, "deployment-ca"), _ca(tmp_path, "gateway-ca")
    egress = egress_of(deployment(ca_file=str(mine)), str(everyone))
    subjects = _subjects(egress.ssl_context())
    assert {"deployment-ca", "gateway-ca"} <= subjects and len(subjects) > 10  # certifi's roots too


def test_the_environments_bundle_replaces_certifis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _ca(tmp_path, "corporate-root")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setenv("CURL_CA_BUNDLE", str(bundle))
    egress = egress_of(deployment())
    assert egress.ca_bundle == str(bundle) and _subjects(egress.ssl_context()) == {"corporate-root"}
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(_ca(tmp_path, "requests-first")))
    assert _subjects(egress_of(deployment()).ssl_context()) == {"requests-first"}


def test_a_client_certificate_is_loaded_into_the_context(tmp_path: Path) -> None:
    cert = _ca(tmp_path, "client")
    egress = egress_of(deployment(client_cert=str(cert), client_key=str(tmp_path / "client.key")))
    egress.ssl_context()  # loads the pair: a key that doesn't match would raise
    assert check_files(egress) is None
    wrong = egress_of(deployment(client_cert=str(cert), client_key=str(tmp_path / "missing.key")))
    assert check_files(wrong) == f"client_key {tmp_path / 'missing.key'}: no such file"


def test_describe_masks_the_proxys_password() -> None:
    egress = egress_of(deployment(proxy="http://user:s3cret@proxy.internal:3128"))
    lines = describe(egress, "http://a.test")
    assert lines[0] == "proxy: http://user:***@proxy.internal:3128" and "s3cret" not in "".join(lines)
    assert masked("http://proxy:3128") == "http://proxy:3128"


@pytest.mark.parametrize(
    ("deployment_keys", "message"),
    [
        pytest.param({"proxy": "ftp://x"}, "Not a proxy URL", id="proxy-scheme"),
        pytest.param({"proxy": "http://:3128"}, "Not a proxy URL", id="proxy-host"),
        pytest.param({"client_key": "k.pem"}, "client_key needs client_cert", id="key-without-cert"),
    ],
)
def test_egress_keys_are_checked(deployment_keys: dict[str, str], message: str) -> None:
    raw = {
        "models": [
            {
                "id": "m",
                "aliases": [],
                "price": {"input": 1, "output": 1},
                "deployments": [{"name": "a", "base_url": "http://a.test", "upstream_model": "m", **deployment_keys}],
            }
        ]
    }
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, environ={})


def test_relative_tls_paths_are_beside_the_config_file(tmp_path: Path) -> None:
    raw = {
        "gateway": {"ca_file": "ca/all.pem"},
        "models": [
            {
                "id": "m",
                "aliases": [],
                "price": {"input": 1, "output": 1},
                "deployments": [
                    {"name": "a", "base_url": "https://a.test", "upstream_model": "m", "ca_file": "mine.pem"}
                ],
            }
        ],
    }
    config = parse_config(raw, path=str(tmp_path / "ezat.toml"), environ={})
    assert config.gateway.ca_file == str(tmp_path / "ca/all.pem")
    assert config.models[0].deployments[0].ca_file == str(tmp_path / "mine.pem")


def test_deployments_on_one_origin_must_share_their_tls_files() -> None:
    def model(name: str, ca: str) -> dict[str, Any]:
        return {
            "id": name,
            "aliases": [],
            "price": {"input": 1, "output": 1},
            "deployments": [{"name": name, "base_url": "https://api.test/x", "upstream_model": "m", "ca_file": ca}],
        }

    parse_config({"models": [model("m1", "/ca.pem"), model("m2", "/ca.pem")]}, environ={})
    with pytest.raises(ConfigError, match=r"shares https://api\.test with 'm1'"):
        parse_config({"models": [model("m1", "/ca.pem"), model("m2", "/other.pem")]}, environ={})


def test_the_ca_setting_reaches_the_sessions_adapter(tmp_path: Path) -> None:
    mine = _ca(tmp_path, "deployment-ca")
    upstream = client()
    tls = Deployment(name="t", base_url="https://t.test:8443", upstream_model="m", api_key="k", ca_file=str(mine))
    route = upstream._route(tls)
    adapter = upstream.session.get_adapter("https://t.test:8443/v1/messages")
    assert adapter is route.adapter  # mounted on the worker's one Session for the origin
    context = adapter.build_connection_pool_key_attributes(
        requests.Request("POST", "https://t.test:8443/v1/messages").prepare(), True
    )[1]["ssl_context"]
    assert "deployment-ca" in _subjects(context)
    upstream.clear()


def test_an_upstream_answer_is_read_through_a_buffer_of_answer_read_buffer_bytes() -> None:
    """One read of the socket takes at most ``ANSWER_READ_BUFFER`` bytes (http.client's 8 KB
    by default): what the answer's reader holds after its head is what that read left."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 20000\r\n\r\n"
        theirs.sendall(head + b"x" * 20000)
        connection_class = CHECKED_POOLS["http"].ConnectionCls
        answer = connection_class.response_class(ours, method="POST")
        answer.begin()
        assert answer.status == 200
        assert 0 < len(answer.peek()) == ANSWER_READ_BUFFER - len(head)
        assert answer.read() == b"x" * 20000
        answer.close()


def test_every_pool_of_the_upstream_adapter_reads_its_answers_through_that_buffer() -> None:
    adapter = TLSAdapter(None, pool_maxsize=1)
    for scheme in ("http", "https"):
        pool_class = adapter.poolmanager.pool_classes_by_scheme[scheme]
        assert pool_class is CHECKED_POOLS[scheme]
        assert pool_class.ConnectionCls.response_class is CHECKED_POOLS["http"].ConnectionCls.response_class
    proxied = adapter.proxy_manager_for("http://127.0.0.1:9")
    assert proxied.pool_classes_by_scheme is CHECKED_POOLS
