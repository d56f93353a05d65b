"""The gateway's egress with real programs on loopback: a forward proxy (tinyproxy), an upstream
over TLS with a private CA, an upstream that requires a client certificate (mTLS), and
``check-config``'s account of them.

- The environment, as every requests program reads it: ``HTTP_PROXY``/``HTTPS_PROXY`` (either
  case) carry every upstream call (JSON and streams, on the three POST routes) and every image
  download through the proxy; ``NO_PROXY`` bypasses it; ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
  name the CA bundle.
- A deployment's ``proxy`` (with Basic credentials) is used without the environment, and
  ``proxy = ""`` overrides it; ``ca_file`` (the deployment's or ``[gateway]``'s) is trusted;
  ``client_cert``/``client_key`` are shown to an mTLS upstream.
- Failures are the gateway's, never the client's: an unverifiable certificate is a 500
  ``server_error`` saying so (after failover), a missing client certificate a 500, a proxy's
  or upstream's 4xx that isn't Anthropic's JSON error a 500; each logged with the deployment,
  the host and the reason (the SSL reason, or the status and the first bytes of the body).
- The SSRF guard still refuses a private image host when the download would go through a proxy,
  before anything is sent.

Outside CI the proxy tests skip when tinyproxy is missing; under CI=true they must run
(``.ci/run`` installs it). The proxy, the TLS simulators (gunicorn's own TLS) and the gateway
(gunicorn, gevent) are separate processes on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
import requests

from ezat_compat.domain import Deployment
from ezat_compat.upstream.egress import egress_of
from ezat_compat.upstream.providers import make_provider
from tests.integration.egress_rig import (
    EGRESS_VARS,
    PKI,
    EgressGateway,
    EgressModel,
    RecordingServer,
    Tinyproxy,
    TlsSim,
    egress_model,
    small_png,
    wait_for,
)
from tests.integration.harness import Sim

pytestmark = pytest.mark.integration

USER, PASSWORD = "egress", "pw-s3cret"
ROUTES = ("chat", "messages", "responses")
CALLS = [
    pytest.param(route, stream, id=f"{route}-{'stream' if stream else 'json'}")
    for route in ROUTES
    for stream in (False, True)
]
NOT_PUBLIC = "could not download the image (the host is not a public address)"
SSL_REASON = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.I)
HANDSHAKE_REASON = re.compile(r"ssl|tls|certificate|handshake", re.I)
PROXY_407_BODY = b"<html><head><title>407 Proxy Authentication Required</title></head><body>sign in</body></html>"
UPSTREAM_400_BODY = b"<html><body><h1>Request blocked by the egress policy</h1></body></html>"


# ---------------------------------------------------------------- programs


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    server = Sim(name="plain").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki")).make()


@pytest.fixture(scope="module")
def tls_sim(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSim]:
    server = TlsSim(tmp_path_factory.mktemp("tls-sim"), pki).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_sim(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSim]:
    server = TlsSim(tmp_path_factory.mktemp("mtls-sim"), pki, mtls=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def untrusted_sim(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSim]:
    """Another TLS simulator, for the deployments that don't trust the CA (the gateway holds one
    set of TLS files per origin: deployments sharing an origin must share them)."""
    server = TlsSim(tmp_path_factory.mktemp("untrusted-sim"), pki).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bare_mtls_sim(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSim]:
    """Another mTLS simulator, for the deployment without a client certificate."""
    server = TlsSim(tmp_path_factory.mktemp("bare-mtls-sim"), pki, mtls=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tinyproxy]:
    server = Tinyproxy(tmp_path_factory.mktemp("tinyproxy")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def auth_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tinyproxy]:
    server = Tinyproxy(tmp_path_factory.mktemp("tinyproxy-auth"), auth=(USER, PASSWORD)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def images() -> Iterator[RecordingServer]:
    server = RecordingServer(200, "image/png", small_png())
    yield server
    server.close()


@pytest.fixture(scope="module")
def proxy_407() -> Iterator[RecordingServer]:
    """A stand-in for a proxy that wants credentials: every request gets an HTML 407. (Not
    tinyproxy's own 407: it closes the connection without reading a POST's body, so the client
    may see a reset instead of the answer.)"""
    server = RecordingServer(407, "text/html", PROXY_407_BODY)
    yield server
    server.close()


@pytest.fixture(scope="module")
def html_400() -> Iterator[RecordingServer]:
    """A stand-in for a filtering middlebox in front of the upstream: an HTML 400."""
    server = RecordingServer(400, "text/html", UPSTREAM_400_BODY)
    yield server
    server.close()


def start_gateway(
    root: Path, models: list[EgressModel], env: dict[str, str] | None = None, **settings: Any
) -> EgressGateway:
    return EgressGateway(root=root, models=models, env=env or {}, gateway_settings=settings).start()


# ---------------------------------------------------------------- calls


def client() -> requests.Session:
    """The test's own client: never through a proxy, whatever this machine's environment says."""
    s = requests.Session()
    s.trust_env = False
    return s


def post(
    gw: EgressGateway, key: str, route: str, model: str, *, stream: bool = False, content: Any = None
) -> requests.Response:
    text = content if content is not None else "hello"
    if route == "chat":
        path = "/openai/v1/chat/completions"
        body: dict[str, Any] = {
            "model": model,
            "max_completion_tokens": 32,
            "messages": [{"role": "user", "content": text}],
        }
        headers = {"authorization": f"Bearer {key}"}
    elif route == "messages":
        path = "/v1/messages"
        body = {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": text}]}
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    else:
        path = "/openai/v1/responses"
        body = {"model": model, "max_output_tokens": 32, "input": text}
        headers = {"authorization": f"Bearer {key}"}
    if stream:
        body["stream"] = True
    with client() as s:
        resp = s.post(gw.url + path, json=body, headers=headers, timeout=60, stream=stream)
        resp.content  # noqa: B018 - read the whole answer (a stream to its end) within the timeout
    return resp


def sse_data(resp: requests.Response) -> list[Any]:
    out: list[Any] = []
    for line in resp.text.splitlines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def assert_answered(resp: requests.Response, route: str, stream: bool) -> None:
    """A complete, successful answer of ``route``: text in it, a stream to its last event."""
    assert resp.status_code == 200, resp.text
    if stream:
        assert resp.headers["content-type"].startswith("text/event-stream"), resp.headers
        data = sse_data(resp)
        assert not any(isinstance(d, dict) and ("error" in d or d.get("type") == "error") for d in data), data
        if route == "chat":
            assert data[-1] == "[DONE]"
            assert "".join(d["choices"][0]["delta"].get("content") or "" for d in data[:-1] if d["choices"])
        elif route == "messages":
            assert data[-1]["type"] == "message_stop"
            assert "".join(d["delta"].get("text", "") for d in data if d["type"] == "content_block_delta")
        else:
            assert data[-1]["type"] == "response.completed"
            assert "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
        return
    body = resp.json()
    if route == "chat":
        assert body["choices"][0]["message"]["content"]
    elif route == "messages":
        assert body["type"] == "message" and body["content"][0]["text"]
    else:
        assert body["status"] == "completed" and body["output"][-1]["content"][0]["text"]


def assert_server_error(resp: requests.Response, route: str = "chat") -> str:
    """The spec's 500 ``server_error`` (the gateway's fault, not the client's); its message."""
    assert resp.status_code == 500, resp.text
    error = resp.json()["error"]
    assert error["type"] == ("api_error" if route == "messages" else "server_error"), error
    return str(error["message"])


def upstream_posts(proxy: Tinyproxy, mark: int, origin: str) -> int:
    """How many ``POST origin/v1/messages`` the proxy logged after ``mark``."""
    return sum(
        1 for method, target in proxy.requests_since(mark) if method == "POST" and target == origin + "/v1/messages"
    )


def log_lines(gw: EgressGateway, mark: int, *needles: str, pattern: re.Pattern[str] | None = None) -> list[str]:
    """The gateway's log lines after ``mark`` holding every needle (and matching ``pattern``),
    waited for a little: the log may trail the answer."""

    def found() -> list[str]:
        return [
            line
            for line in gw.lines_after(mark)
            if all(n in line for n in needles) and (pattern is None or pattern.search(line))
        ]

    return list(wait_for(found))


def image_content(url: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": url}}]


# ---------------------------------------------------------------- the proxy of the environment


@pytest.fixture(scope="module")
def env_gw(
    sim: Sim,
    tls_sim: TlsSim,
    pki: PKI,
    proxy: Tinyproxy,
    auth_proxy: Tinyproxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EgressGateway]:
    """HTTP_PROXY and HTTPS_PROXY name tinyproxy; some deployments say otherwise."""
    models = [
        egress_model("env", {"name": "plain", "base_url": sim.url}),
        egress_model("env-tls", {"name": "tls-through-env", "base_url": tls_sim.url, "ca_file": str(pki.ca)}),
        egress_model("none", {"name": "plain-direct", "base_url": sim.url, "proxy": ""}),
        egress_model("own", {"name": "plain-own", "base_url": sim.url, "proxy": auth_proxy.url_with(USER, PASSWORD)}),
    ]
    env = {"HTTP_PROXY": proxy.url, "HTTPS_PROXY": proxy.url}
    gw = start_gateway(tmp_path_factory.mktemp("env-proxy"), models, env)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def env_key(env_gw: EgressGateway) -> str:
    return env_gw.new_key("egress-env")


@pytest.mark.parametrize(("route", "stream"), CALLS)
def test_the_environments_proxy_carries_every_upstream_call(
    env_gw: EgressGateway, env_key: str, sim: Sim, proxy: Tinyproxy, route: str, stream: bool
) -> None:
    sim.clear()
    mark = proxy.mark()
    assert_answered(post(env_gw, env_key, route, "egress/env", stream=stream), route, stream)
    sent = [r for r in sim.requests() if r["path"] == "/v1/messages"]
    assert len(sent) == 1
    assert wait_for(lambda: upstream_posts(proxy, mark, sim.url) == 1), proxy.requests_since(mark)
    assert "tinyproxy" in sent[0]["headers"].get("via", ""), sent[0]["headers"]  # it came through the proxy


def test_https_upstreams_tunnel_through_the_environments_https_proxy(
    env_gw: EgressGateway, env_key: str, tls_sim: TlsSim, proxy: Tinyproxy
) -> None:
    before = len(tls_sim.bodies())
    for stream in (False, True):
        assert_answered(post(env_gw, env_key, "chat", "egress/env-tls", stream=stream), "chat", stream)
    assert len(tls_sim.bodies()) == before + 2
    origin = tls_sim.url.removeprefix("https://")
    # A tunnel carries every request of its kept-alive connection: one CONNECT at least, ever.
    assert ("CONNECT", origin) in proxy.requests_since(0)


def test_image_downloads_go_through_the_environments_proxy(
    env_gw: EgressGateway, env_key: str, sim: Sim, proxy: Tinyproxy, images: RecordingServer
) -> None:
    path = f"/cat-{uuid.uuid4().hex}.png"
    mark = proxy.mark()
    resp = post(env_gw, env_key, "chat", "egress/env", content=image_content(images.url + path))
    assert_answered(resp, "chat", False)
    assert images.seen(path) == [path]
    assert ("GET", images.url + path) in proxy.requests_since(mark)


def test_proxy_empty_in_the_deployment_overrides_the_environment(
    env_gw: EgressGateway, env_key: str, sim: Sim, proxy: Tinyproxy
) -> None:
    sim.clear()
    mark = proxy.mark()
    for stream in (False, True):
        assert_answered(post(env_gw, env_key, "chat", "egress/none", stream=stream), "chat", stream)
    sent = [r for r in sim.requests() if r["path"] == "/v1/messages"]
    assert len(sent) == 2 and not any("via" in r["headers"] for r in sent)
    assert upstream_posts(proxy, mark, sim.url) == 0


def test_the_deployments_proxy_wins_over_the_environments(
    env_gw: EgressGateway, env_key: str, sim: Sim, proxy: Tinyproxy, auth_proxy: Tinyproxy
) -> None:
    mark, auth_mark = proxy.mark(), auth_proxy.mark()
    for stream in (False, True):
        assert_answered(post(env_gw, env_key, "chat", "egress/own", stream=stream), "chat", stream)
    assert wait_for(lambda: upstream_posts(auth_proxy, auth_mark, sim.url) == 2), auth_proxy.requests_since(auth_mark)
    assert upstream_posts(proxy, mark, sim.url) == 0


# ---------------------------------------------------------------- NO_PROXY (and the lower-case names)


@pytest.fixture(scope="module")
def no_proxy_gw(sim: Sim, proxy: Tinyproxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EgressGateway]:
    """``http_proxy`` names tinyproxy, ``no_proxy=127.0.0.1`` exempts the numeric address only:
    the same simulator named ``localhost`` still goes through the proxy."""
    models = [
        egress_model("direct", {"name": "by-address", "base_url": sim.url}),
        egress_model("named", {"name": "by-name", "base_url": sim.url.replace("127.0.0.1", "localhost")}),
    ]
    gw = start_gateway(tmp_path_factory.mktemp("no-proxy"), models, {"http_proxy": proxy.url, "no_proxy": "127.0.0.1"})
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def no_proxy_key(no_proxy_gw: EgressGateway) -> str:
    return no_proxy_gw.new_key("egress-no-proxy")


@pytest.mark.parametrize(("route", "stream"), CALLS)
def test_no_proxy_bypasses_the_proxy(
    no_proxy_gw: EgressGateway, no_proxy_key: str, sim: Sim, proxy: Tinyproxy, route: str, stream: bool
) -> None:
    sim.clear()
    mark = proxy.mark()
    assert_answered(post(no_proxy_gw, no_proxy_key, route, "egress/direct", stream=stream), route, stream)
    assert len(sim.bodies()) == 1
    assert proxy.requests_since(mark) == []


def test_no_proxy_bypasses_the_proxy_for_image_downloads(
    no_proxy_gw: EgressGateway, no_proxy_key: str, proxy: Tinyproxy, images: RecordingServer
) -> None:
    path = f"/dog-{uuid.uuid4().hex}.png"
    mark = proxy.mark()
    assert_answered(
        post(no_proxy_gw, no_proxy_key, "chat", "egress/direct", content=image_content(images.url + path)),
        "chat",
        False,
    )
    assert images.seen(path) == [path]
    assert proxy.requests_since(mark) == []


def test_lower_case_http_proxy_is_honoured_for_hosts_no_proxy_does_not_name(
    no_proxy_gw: EgressGateway, no_proxy_key: str, sim: Sim, proxy: Tinyproxy
) -> None:
    origin = sim.url.replace("127.0.0.1", "localhost")
    mark = proxy.mark()
    for stream in (False, True):
        assert_answered(post(no_proxy_gw, no_proxy_key, "chat", "egress/named", stream=stream), "chat", stream)
    assert wait_for(lambda: upstream_posts(proxy, mark, origin) == 2), proxy.requests_since(mark)


# ---------------------------------------------------------------- a deployment's proxy, no environment


@pytest.fixture(scope="module")
def own_proxy_gw(sim: Sim, auth_proxy: Tinyproxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EgressGateway]:
    models = [
        egress_model("own", {"name": "own-proxy", "base_url": sim.url, "proxy": auth_proxy.url_with(USER, PASSWORD)})
    ]
    gw = start_gateway(tmp_path_factory.mktemp("own-proxy"), models)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def own_proxy_key(own_proxy_gw: EgressGateway) -> str:
    return own_proxy_gw.new_key("egress-own")


@pytest.mark.parametrize(("route", "stream"), CALLS)
def test_a_deployments_proxy_with_credentials_is_used_without_the_environment(
    own_proxy_gw: EgressGateway, own_proxy_key: str, sim: Sim, auth_proxy: Tinyproxy, route: str, stream: bool
) -> None:
    key = own_proxy_key
    sim.clear()
    mark = auth_proxy.mark()
    assert_answered(post(own_proxy_gw, key, route, "egress/own", stream=stream), route, stream)
    assert len(sim.bodies()) == 1
    assert wait_for(lambda: upstream_posts(auth_proxy, mark, sim.url) == 1), auth_proxy.requests_since(mark)


# ---------------------------------------------------------------- TLS and mTLS upstreams, no environment


@pytest.fixture(scope="module")
def tls_gw(
    sim: Sim,
    tls_sim: TlsSim,
    untrusted_sim: TlsSim,
    mtls_sim: TlsSim,
    bare_mtls_sim: TlsSim,
    pki: PKI,
    proxy_407: RecordingServer,
    html_400: RecordingServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EgressGateway]:
    ca, cert, key = str(pki.ca), str(pki.client_cert), str(pki.client_key)
    models = [
        egress_model("tls-ca", {"name": "tls-ca", "base_url": tls_sim.url, "ca_file": ca}),
        egress_model("tls-unknown-ca", {"name": "tls-unknown-ca", "base_url": untrusted_sim.url}),
        egress_model(
            "tls-failover",
            {"name": "tls-bad", "base_url": untrusted_sim.url, "priority": 0},
            {"name": "plain-good", "base_url": sim.url, "priority": 1},
        ),
        egress_model(
            "mtls-cert",
            {"name": "mtls-cert", "base_url": mtls_sim.url, "ca_file": ca, "client_cert": cert, "client_key": key},
        ),
        egress_model("mtls-no-cert", {"name": "mtls-no-cert", "base_url": bare_mtls_sim.url, "ca_file": ca}),
        # Port 9 (discard) refuses on loopback: a 407 proves the request went to the proxy.
        egress_model("proxy-407", {"name": "proxy-407", "base_url": "http://127.0.0.1:9", "proxy": proxy_407.url}),
        egress_model("html-400", {"name": "html-400", "base_url": html_400.url}),
    ]
    gw = start_gateway(tmp_path_factory.mktemp("tls"), models)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def tls_key(tls_gw: EgressGateway) -> str:
    return tls_gw.new_key("egress-tls")


@pytest.mark.parametrize(("route", "stream"), CALLS)
def test_a_deployments_ca_file_verifies_its_upstream(
    tls_gw: EgressGateway, tls_key: str, tls_sim: TlsSim, route: str, stream: bool
) -> None:
    before = len(tls_sim.bodies())
    assert_answered(post(tls_gw, tls_key, route, "egress/tls-ca", stream=stream), route, stream)
    assert len(tls_sim.bodies()) == before + 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_unverifiable_certificate_is_a_500_server_error_and_logged(
    tls_gw: EgressGateway, tls_key: str, untrusted_sim: TlsSim, stream: bool
) -> None:
    before = len(untrusted_sim.bodies())
    mark = tls_gw.log_mark()
    message = assert_server_error(post(tls_gw, tls_key, "chat", "egress/tls-unknown-ca", stream=stream))
    assert re.search(r"certificate", message, re.I) and re.search(r"verif", message, re.I), message
    assert len(untrusted_sim.bodies()) == before  # nothing was sent over the unverified connection
    # One line says it all: the deployment, the host and the SSL library's reason.
    lines = log_lines(tls_gw, mark, "tls-unknown-ca", "127.0.0.1", pattern=SSL_REASON)
    assert len(lines) == 1, tls_gw.lines_after(mark)


def test_an_unverifiable_certificate_on_the_messages_route_is_a_500(tls_gw: EgressGateway, tls_key: str) -> None:
    message = assert_server_error(post(tls_gw, tls_key, "messages", "egress/tls-unknown-ca"), "messages")
    assert re.search(r"certificate", message, re.I), message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tls_failure_fails_over_to_the_next_deployment(
    tls_gw: EgressGateway, tls_key: str, sim: Sim, stream: bool
) -> None:
    sim.clear()
    mark = tls_gw.log_mark()
    assert_answered(post(tls_gw, tls_key, "chat", "egress/tls-failover", stream=stream), "chat", stream)
    assert len(sim.bodies()) == 1
    assert len(log_lines(tls_gw, mark, "tls-bad", "127.0.0.1", pattern=SSL_REASON)) == 1, tls_gw.lines_after(mark)


@pytest.mark.parametrize(("route", "stream"), CALLS)
def test_a_client_certificate_opens_an_mtls_upstream(
    tls_gw: EgressGateway, tls_key: str, mtls_sim: TlsSim, route: str, stream: bool
) -> None:
    before = len(mtls_sim.bodies())
    assert_answered(post(tls_gw, tls_key, route, "egress/mtls-cert", stream=stream), route, stream)
    assert len(mtls_sim.bodies()) == before + 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_mtls_upstream_without_a_client_certificate_is_a_500_not_a_400(
    tls_gw: EgressGateway, tls_key: str, bare_mtls_sim: TlsSim, stream: bool
) -> None:
    before = len(bare_mtls_sim.bodies())
    mark = tls_gw.log_mark()
    message = assert_server_error(post(tls_gw, tls_key, "chat", "egress/mtls-no-cert", stream=stream))
    assert "TLS" in message, message
    assert len(bare_mtls_sim.bodies()) == before
    assert log_lines(tls_gw, mark, "mtls-no-cert", "127.0.0.1", pattern=HANDSHAKE_REASON), tls_gw.lines_after(mark)


@pytest.mark.parametrize(
    ("model", "server", "status", "body"),
    [("proxy-407", "proxy_407", 407, PROXY_407_BODY), ("html-400", "html_400", 400, UPSTREAM_400_BODY)],
    ids=["proxy-407", "upstream-html-400"],
)
def test_a_4xx_that_is_not_anthropics_error_is_a_500_logged_with_status_and_body(
    tls_gw: EgressGateway,
    tls_key: str,
    request: pytest.FixtureRequest,
    model: str,
    server: str,
    status: int,
    body: bytes,
) -> None:
    recorder: RecordingServer = request.getfixturevalue(server)
    before = len(recorder.paths)
    mark = tls_gw.log_mark()
    for route in ROUTES:
        assert_server_error(post(tls_gw, tls_key, route, f"egress/{model}"), route)
    assert len(recorder.paths) > before  # it was asked, and answered the 4xx
    start = body[:24].decode()  # no quotes in it: the same in a JSON log line
    assert log_lines(tls_gw, mark, model, str(status), start), tls_gw.lines_after(mark)


# ---------------------------------------------------------------- the CA bundle of the environment, [gateway] ca_file


@pytest.fixture(
    scope="module", params=["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "gateway.ca_file"], ids=lambda p: str(p)
)
def ca_gw(
    request: pytest.FixtureRequest, tls_sim: TlsSim, pki: PKI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EgressGateway]:
    """A deployment without ``ca_file`` on the TLS simulator; the CA comes from elsewhere."""
    models = [egress_model("tls-elsewhere", {"name": "tls-elsewhere", "base_url": tls_sim.url})]
    root = tmp_path_factory.mktemp("ca-" + request.param.replace(".", "-").lower())
    if request.param == "gateway.ca_file":
        gw = start_gateway(root, models, ca_file=str(pki.ca))
    else:
        gw = start_gateway(root, models, {request.param: str(pki.bundle)})  # certifi's bundle plus the CA
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def ca_key(ca_gw: EgressGateway) -> str:
    return ca_gw.new_key("egress-ca")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_ca_may_come_from_the_environment_or_the_gateway_section(
    ca_gw: EgressGateway, ca_key: str, tls_sim: TlsSim, stream: bool
) -> None:
    key = ca_key
    before = len(tls_sim.bodies())
    assert_answered(post(ca_gw, key, "chat", "egress/tls-elsewhere", stream=stream), "chat", stream)
    assert len(tls_sim.bodies()) == before + 1


# ---------------------------------------------------------------- the SSRF guard with a proxy


@pytest.fixture(scope="module")
def guarded_gw(sim: Sim, proxy: Tinyproxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EgressGateway]:
    """The default image rule (public hosts only) with HTTP_PROXY set."""
    models = [egress_model("env", {"name": "plain", "base_url": sim.url})]
    gw = start_gateway(
        tmp_path_factory.mktemp("guarded"), models, {"HTTP_PROXY": proxy.url}, allow_private_image_hosts=False
    )
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def guarded_key(guarded_gw: EgressGateway) -> str:
    return guarded_gw.new_key("egress-guarded")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_private_image_host_is_refused_before_the_proxy_is_asked(
    guarded_gw: EgressGateway, guarded_key: str, sim: Sim, proxy: Tinyproxy, images: RecordingServer, host: str
) -> None:
    path = f"/private-{uuid.uuid4().hex}.png"
    sim.clear()
    mark = proxy.mark()
    url = images.url.replace("127.0.0.1", host) + path  # a private address, or a name that resolves to one
    resp = post(guarded_gw, guarded_key, "chat", "egress/env", content=image_content(url))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and NOT_PUBLIC in error["message"], error
    assert images.seen(path) == []
    assert proxy.requests_since(mark) == []
    assert sim.bodies() == []


# ---------------------------------------------------------------- check-config


def _blocks(text: str, names: list[str]) -> dict[str, str]:
    """Each deployment's part of ``text``: from its name to the next one's."""
    spots = sorted((text.index(name), name) for name in names)
    ends = [start for start, _ in spots[1:]] + [len(text)]
    return {name: text[start:end] for (start, name), end in zip(spots, ends, strict=True)}


def _config_gateway(
    root: Path, models: list[EgressModel], env: dict[str, str] | None = None, **settings: Any
) -> EgressGateway:
    root.mkdir(parents=True, exist_ok=True)
    env = {"ANTHROPIC_API_KEY": "sk-ant-test", **(env or {})}  # no warning about a missing key
    gw = EgressGateway(root=root, models=models, env=env, gateway_settings=settings)
    gw.write_config()
    return gw


def test_check_config_shows_each_deployments_egress_with_the_password_masked(pki: PKI, tmp_path: Path) -> None:
    own = "http://operator:op-pa55word@127.0.0.1:3128"
    models = [
        egress_model(
            "cfg-own",
            {
                "name": "dep-own-proxy",
                "base_url": "https://127.0.0.1:9443",
                "proxy": own,
                "ca_file": str(pki.ca),
                "client_cert": str(pki.client_cert),
                "client_key": str(pki.client_key),
            },
        ),
        egress_model("cfg-env", {"name": "dep-env-proxy", "base_url": "https://127.0.0.1:9444"}),
        egress_model("cfg-none", {"name": "dep-no-proxy", "base_url": "https://127.0.0.1:9445", "proxy": ""}),
    ]
    env = {"HTTPS_PROXY": "http://envuser:env-pa55word@127.0.0.1:3129"}
    result = _config_gateway(tmp_path / "cfg", models, env).cli("check-config", check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "pa55word" not in output
    blocks = _blocks(result.stdout, ["dep-own-proxy", "dep-env-proxy", "dep-no-proxy"])
    assert "http://operator:***@127.0.0.1:3128" in blocks["dep-own-proxy"], output
    assert str(pki.ca) in blocks["dep-own-proxy"]
    assert str(pki.client_cert) in blocks["dep-own-proxy"]
    assert "http://envuser:***@127.0.0.1:3129" in blocks["dep-env-proxy"], output
    assert "127.0.0.1:31" not in blocks["dep-no-proxy"], output  # neither proxy
    assert str(pki.client_cert) not in blocks["dep-no-proxy"]


def _missing(pki: PKI, tmp: Path) -> dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any], Path]]]:
    gone = tmp / "nowhere" / "missing.pem"
    folder = tmp / "a-folder.pem"
    folder.mkdir()
    base = {"name": "dep-files", "base_url": "https://127.0.0.1:9443"}
    return {
        "ca_file": lambda: ({**base, "ca_file": str(gone)}, {}, gone),
        "client_key": lambda: ({**base, "client_cert": str(pki.client_cert), "client_key": str(gone)}, {}, gone),
        "client_cert": lambda: ({**base, "client_cert": str(gone), "client_key": str(pki.client_key)}, {}, gone),
        "gateway.ca_file": lambda: (base, {"ca_file": str(gone)}, gone),
        "ca_file is a folder": lambda: ({**base, "ca_file": str(folder)}, {}, folder),
    }


@pytest.mark.parametrize("case", ["ca_file", "client_key", "client_cert", "gateway.ca_file", "ca_file is a folder"])
def test_check_config_fails_in_one_line_on_a_missing_or_unreadable_file(pki: PKI, tmp_path: Path, case: str) -> None:
    deployment, settings, path = _missing(pki, tmp_path)[case]()
    gw = _config_gateway(tmp_path / "cfg", [egress_model("cfg", deployment)], **settings)
    result = gw.cli("check-config", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0], lines


# ---------------------------------------------------------------- Bedrock's credential calls (STS AssumeRole)

ROLE_KEYS = ("ASIAEZATFAKESTSKEY01", "fake-sts-secret-access-key", "fake-sts-session-token")
AWS_CONFIG = """\
[profile ezat]
role_arn = arn:aws:iam::123456789012:role/ezat-bedrock
source_profile = base
region = us-east-1

[profile base]
aws_access_key_id = AKIAEZATBASEKEY00001
aws_secret_access_key = base-secret-access-key
"""


def assume_role_response() -> bytes:
    """STS's AssumeRole answer as the service sends it (STS API reference, "AssumeRole":
    ``AssumeRoleResponse`` / ``AssumeRoleResult`` / ``Credentials``), valid for an hour."""
    expiration = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    key, secret, token = ROLE_KEYS
    return f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <SourceIdentity>ezat</SourceIdentity>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/ezat-bedrock/ezat</Arn>
      <AssumedRoleId>AROA3XFRBF535PLBIFPI4:ezat</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>{key}</AccessKeyId>
      <SecretAccessKey>{secret}</SecretAccessKey>
      <SessionToken>{token}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
    <PackedPolicySize>6</PackedPolicySize>
  </AssumeRoleResult>
  <ResponseMetadata>
    <RequestId>c6104cbe-af31-11e0-8154-cbc7ccf896c7</RequestId>
  </ResponseMetadata>
</AssumeRoleResponse>
""".encode()


@pytest.fixture(scope="module")
def sts() -> Iterator[RecordingServer]:
    """A fake STS over plain HTTP: every request gets the AssumeRole answer."""
    server = RecordingServer(200, "text/xml", assume_role_response())
    yield server
    server.close()


@pytest.fixture(scope="module")
def mtls_sts(pki: PKI) -> Iterator[RecordingServer]:
    """A fake STS over TLS that requires a client certificate the test CA signed."""
    server = RecordingServer(200, "text/xml", assume_role_response(), pki.server_context(require_client_cert=True))
    yield server
    server.close()


def assume_role_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sts_url: str) -> None:
    """botocore's environment for profile ``ezat`` (a role assumed with profile ``base``'s
    static keys) and STS at ``sts_url`` (``AWS_ENDPOINT_URL_STS``); none of this machine's AWS
    or egress variables, one attempt per call."""
    for name in [n for n in os.environ if n.startswith("AWS_")] + list(EGRESS_VARS):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text(AWS_CONFIG)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts_url)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def bedrock_credentials(**egress: Any) -> Any:
    """The frozen credentials of a Bedrock deployment on profile ``ezat`` with the egress keys
    ``egress``, made as the upstream client makes its provider."""
    deployment = Deployment(
        name="bedrock-sts",
        base_url="https://bedrock-runtime.us-east-1.amazonaws.com",
        upstream_model="anthropic.claude-x-v1:0",
        provider="bedrock",
        region="us-east-1",
        api_key_env="",
        aws_profile="ezat",
        **egress,
    )
    provider: Any = make_provider(deployment, egress_of(deployment))
    return provider.credentials().get_frozen_credentials()


def sts_requests(proxy: Tinyproxy, mark: int, sts: RecordingServer) -> list[tuple[str, str]]:
    """The requests to ``sts`` (plain or a CONNECT tunnel) the proxy logged after ``mark``."""
    return [(method, target) for method, target in proxy.requests_since(mark) if f"127.0.0.1:{sts.port}" in target]


@pytest.mark.parametrize(
    ("own_proxy", "environment_proxy", "through_proxy"),
    [
        pytest.param("tinyproxy", False, True, id="its-proxy"),
        pytest.param("", True, False, id="no-proxy-overrides-the-environment"),
        pytest.param(None, True, True, id="the-environments-proxy"),
    ],
)
def test_bedrocks_sts_call_leaves_through_the_deployments_proxy(
    proxy: Tinyproxy,
    sts: RecordingServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    own_proxy: str | None,
    environment_proxy: bool,
    through_proxy: bool,
) -> None:
    """The role is assumed (STS AssumeRole, as botocore does for a profile with ``role_arn``)
    through the deployment's ``proxy``; ``proxy = ""`` goes direct though ``HTTP(S)_PROXY``
    name the proxy; without the key, botocore follows them."""
    assume_role_environment(monkeypatch, tmp_path, sts.url)
    if environment_proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    mark, answered = proxy.mark(), len(sts.seen("/"))
    frozen = bedrock_credentials(proxy=proxy.url if own_proxy == "tinyproxy" else own_proxy)
    assert (frozen.access_key, frozen.secret_key, frozen.token) == ROLE_KEYS
    assert len(sts.seen("/")) == answered + 1
    if through_proxy:
        assert wait_for(lambda: sts_requests(proxy, mark, sts)) == [("POST", sts.url + "/")]
    else:
        assert sts_requests(proxy, mark, sts) == []


@pytest.mark.parametrize("with_ca_file", [True, False], ids=["its-ca-file-and-certificate", "without-its-ca-file"])
def test_bedrocks_sts_call_trusts_its_ca_file_and_shows_its_client_certificate(
    proxy: Tinyproxy,
    mtls_sts: RecordingServer,
    pki: PKI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    with_ca_file: bool,
) -> None:
    """An STS over mTLS, through the proxy's CONNECT tunnel: the deployment's ``ca_file`` is
    trusted besides the bundle (one combined file for botocore) and its client certificate is
    shown; without the ``ca_file`` the certificate can't be verified."""
    assume_role_environment(monkeypatch, tmp_path, mtls_sts.url)
    mark = proxy.mark()
    egress = {
        "proxy": proxy.url,
        "ca_file": str(pki.ca) if with_ca_file else "",
        "client_cert": str(pki.client_cert),
        "client_key": str(pki.client_key),
    }
    if with_ca_file:
        frozen = bedrock_credentials(**egress)
        assert (frozen.access_key, frozen.secret_key, frozen.token) == ROLE_KEYS
    else:
        with pytest.raises(botocore.exceptions.SSLError, match=SSL_REASON):
            bedrock_credentials(**egress)
    assert wait_for(lambda: sts_requests(proxy, mark, mtls_sts)) == [("CONNECT", f"127.0.0.1:{mtls_sts.port}")]
