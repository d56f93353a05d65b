"""The providers' pure parts, by tables: body shaping, beta rules, error shapes, Bedrock's
event-stream decoding (fed split at every byte) and SigV4 as the simulator verifies it."""

from __future__ import annotations

import base64
import json
import stat
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import botocore.utils
import pytest
import requests
from botocore import UNSIGNED
from botocore.config import Config

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.errors import UpstreamStreamError
from ezat_compat.sim import clouds
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.bedrock import iter_event_stream
from ezat_compat.upstream.providers.betas import allowed_betas
from tests.support.deployments import BEDROCK, VERTEX

BETAS = "claude-code-20250219, interleaved-thinking-2025-05-14,effort-2025-11-24,mcp-servers-2025-12-04"


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        pytest.param(
            "anthropic",
            ["claude-code-20250219", "interleaved-thinking-2025-05-14", "effort-2025-11-24", "mcp-servers-2025-12-04"],
            id="anthropic-all-pass",
        ),
        pytest.param(
            "foundry",
            ["claude-code-20250219", "interleaved-thinking-2025-05-14", "effort-2025-11-24", "mcp-servers-2025-12-04"],
            id="foundry-all-pass",
        ),
        pytest.param("bedrock", ["interleaved-thinking-2025-05-14", "effort-2025-11-24"], id="bedrock-allow-list"),
        pytest.param("vertex", ["interleaved-thinking-2025-05-14"], id="vertex-allow-list"),
    ],
)
def test_betas_each_provider_takes(provider: str, expected: list[str]) -> None:
    assert allowed_betas(provider, BETAS) == expected


def test_bedrock_body_has_no_model_nor_stream_and_betas_in_it() -> None:
    source = {"max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    body, headers = make_provider(BEDROCK).shape(encode_body(source), source, True, {"anthropic-beta": BETAS})
    assert headers is None
    assert json.loads(body) == {
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "effort-2025-11-24"],
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    provider = make_provider(BEDROCK)
    assert provider.path("/v1/messages", True) == "/model/anthropic.claude-x-v1%3A0/invoke-with-response-stream"


def test_vertex_body_keeps_stream_and_puts_the_version_in() -> None:
    source = {"max_tokens": 5, "messages": []}
    body, headers = make_provider(VERTEX).shape(encode_body(source), None, True, {"anthropic-beta": BETAS})
    assert json.loads(body) == {
        "anthropic_version": "vertex-2023-10-16",
        "max_tokens": 5,
        "messages": [],
        "stream": True,
    }
    assert headers == {"anthropic-beta": "interleaved-thinking-2025-05-14"}
    assert make_provider(VERTEX).path("/v1/messages", False) == (
        "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-x@1:rawPredict"
    )


@pytest.mark.parametrize(
    ("kind", "status", "expected"),
    [
        ("ThrottlingException:http://internal.amazon.com/coral/", 400, (429, "rate_limit_error")),
        ("ServiceUnavailableException", 503, (503, "overloaded_error")),
        ("ModelNotReadyException", 429, (503, "overloaded_error")),
        ("ValidationException", 400, (400, "invalid_request_error")),
        ("AccessDeniedException", 403, (403, "permission_error")),
        ("UnrecognizedClientException", 403, (403, "permission_error")),
        ("InvalidSignatureException", 403, (403, "permission_error")),
        ("SomethingNew", 502, (502, "api_error")),
    ],
    ids=lambda v: str(v)[:30] if isinstance(v, str) else None,
)
def test_bedrock_errors_become_anthropics(kind: str, status: int, expected: tuple[int, str]) -> None:
    error = make_provider(BEDROCK).status_error(status, b'{"message":"m"}', {"x-amzn-ErrorType": kind})
    assert (error.status_code, error.error_type) == expected
    assert error.failover == (expected[0] != 400)


@pytest.mark.parametrize(
    ("status", "google", "expected"),
    [
        (429, "RESOURCE_EXHAUSTED", (429, "rate_limit_error")),
        (503, "UNAVAILABLE", (503, "overloaded_error")),
        (403, "PERMISSION_DENIED", (403, "permission_error")),
        (400, "INVALID_ARGUMENT", (400, "invalid_request_error")),
    ],
    ids=["resource-exhausted", "unavailable", "permission-denied", "invalid-argument"],
)
def test_vertex_errors_become_anthropics(status: int, google: str, expected: tuple[int, str]) -> None:
    body = json.dumps({"error": {"code": status, "message": "m", "status": google}}).encode()
    error = make_provider(VERTEX).status_error(status, body, {})
    assert (error.status_code, error.error_type, error.message) == (*expected, "m")


RETRY_INFO = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}
QUOTA_FAILURE = {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []}


@pytest.mark.parametrize(
    ("details", "headers", "expected"),
    [
        pytest.param([QUOTA_FAILURE, RETRY_INFO], {}, 30.0, id="retry-info-detail"),
        pytest.param([{**RETRY_INFO, "retryDelay": "1.5s"}], {}, 1.5, id="fractional-duration"),
        pytest.param([RETRY_INFO], {"retry-after": "7"}, 7.0, id="a-header-wins"),
        pytest.param([QUOTA_FAILURE], {}, None, id="no-retry-info"),
        pytest.param([{**RETRY_INFO, "retryDelay": "soon"}], {}, None, id="not-a-duration"),
        pytest.param([{**RETRY_INFO, "retryDelay": 30}], {}, None, id="duration-not-a-string"),
        pytest.param("details", {}, None, id="details-not-a-list"),
    ],
)
def test_a_vertex_quota_answer_says_when_to_retry(
    details: Any, headers: dict[str, str], expected: float | None
) -> None:
    """Vertex answers a quota 429 without ``retry-after``; Google's RetryInfo detail, when it is
    there, is the deployment's cooldown."""
    body = json.dumps(
        {"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED", "details": details}}
    )
    error = make_provider(VERTEX).status_error(429, body.encode(), headers)
    assert (error.status_code, error.upstream_retry_after) == (429, expected)


EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 3, "output_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "h\u00e9llo"}},
    {"type": "message_stop"},
]


def _split(data: bytes, at: int) -> Iterator[bytes]:
    yield data[:at]
    yield data[at:]


def test_event_stream_round_trips_through_botocore_at_every_split() -> None:
    data = b"".join(clouds.chunk_message(e) for e in EVENTS)
    expected = [(e["type"], json.dumps(e, separators=(",", ":"), ensure_ascii=False)) for e in EVENTS]
    for at in range(len(data) + 1):
        assert list(iter_event_stream(_split(data, at))) == expected


def test_event_stream_exceptions_become_error_events_and_a_cut_message_is_dropped() -> None:
    data = clouds.chunk_message(EVENTS[0]) + clouds.exception_message("throttlingException", "slow down")
    events = list(iter_event_stream([data, clouds.chunk_message(EVENTS[2])[:-3]]))
    assert events[0][0] == "message_start"
    assert events[1] == (
        "error",
        json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
    )
    assert len(events) == 2


def test_a_chunk_that_is_not_an_anthropic_event_breaks_the_stream() -> None:
    payload = json.dumps({"bytes": base64.b64encode(b"not json").decode()}).encode()
    bad = clouds.encode_message({":event-type": "chunk", ":message-type": "event"}, payload)
    with pytest.raises(UpstreamStreamError):
        list(iter_event_stream([bad]))


def _signed(monkeypatch: pytest.MonkeyPatch, secret: str, body: bytes) -> requests.PreparedRequest:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", clouds.SIM_AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    provider = make_provider(BEDROCK)
    request = requests.PreparedRequest()
    request.prepare(
        method="POST",
        url="http://sim.test/model/anthropic.claude-x-v1%3A0/invoke",
        headers={"content-type": "application/json", "accept": "application/json"},
        data=body,
    )
    provider.authorize(request)
    return request


@pytest.mark.parametrize(
    ("secret", "sent_body", "skew_s", "refusal"),
    [
        pytest.param(clouds.SIM_AWS_SECRET_ACCESS_KEY, b'{"a":1}', 0, None, id="good"),
        pytest.param("wrong-secret", b'{"a":1}', 0, "does not match", id="wrong-secret"),
        pytest.param(clouds.SIM_AWS_SECRET_ACCESS_KEY, b'{"a":2}', 0, "does not match", id="changed-body"),
        pytest.param(clouds.SIM_AWS_SECRET_ACCESS_KEY, b'{"a":1}', 600, "Signature expired", id="expired-date"),
    ],
)
def test_the_simulator_verifies_sigv4(
    monkeypatch: pytest.MonkeyPatch, secret: str, sent_body: bytes, skew_s: int, refusal: str | None
) -> None:
    request = _signed(monkeypatch, secret, b'{"a":1}')
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = "sim.test"
    url = clouds.bedrock_url("sim.test", "anthropic.claude-x-v1:0", "invoke")
    if refusal is None:
        clouds.verify_sigv4("POST", url, headers, sent_body, now=time.time() + skew_s)
        return
    with pytest.raises(clouds.CloudError) as caught:
        clouds.verify_sigv4("POST", url, headers, sent_body, now=time.time() + skew_s)
    assert caught.value.status == 403 and refusal in caught.value.body["message"]
    assert secret not in json.dumps(caught.value.body)


def _config(**deployment: Any) -> dict[str, Any]:
    return {
        "models": [
            {
                "id": "m",
                "aliases": [],
                "price": {"input": 1, "output": 2},
                "deployments": [{"name": "d", "upstream_model": "x", **deployment}],
            }
        ]
    }


@pytest.mark.parametrize(
    ("deployment", "problem"),
    [
        pytest.param({"provider": "bedrock"}, "needs region", id="bedrock-without-region"),
        pytest.param({"provider": "vertex", "region": "us-east5"}, "needs project", id="vertex-without-project"),
        pytest.param({"provider": "foundry"}, "base_url", id="foundry-without-base-url"),
        pytest.param({"base_url": "https://a.test", "region": "us-east-1"}, "not used by provider", id="stray-region"),
        pytest.param({"provider": "azure"}, "provider", id="unknown-provider"),
        pytest.param(
            {"provider": "bedrock", "region": "us-east-1", "anthropic_version": "2023-06-01"},
            "anthropic_version is not used by provider 'bedrock'",
            id="bedrock-anthropic-version",
        ),
        pytest.param(
            {"provider": "vertex", "region": "us-east5", "project": "p", "anthropic_version": "2023-06-01"},
            "anthropic_version is not used by provider 'vertex'",
            id="vertex-anthropic-version",
        ),
        pytest.param(
            {"provider": "bedrock", "region": "us-east-1", "guardrail": "gr-1"},
            "guardrail and guardrail_version go together",
            id="guardrail-without-version",
        ),
        pytest.param(
            {"provider": "bedrock", "region": "us-east-1", "guardrail_version": "1"},
            "guardrail and guardrail_version go together",
            id="version-without-guardrail",
        ),
        pytest.param(
            {"provider": "bedrock", "region": "us-east-1", "guardrail": "g", "guardrail_version": "v1"},
            "A version number or DRAFT",
            id="guardrail-version-not-a-number",
        ),
        pytest.param(
            {"provider": "bedrock", "region": "us-east-1", "service_tier": "cheap"},
            "Must be one of",
            id="unknown-service-tier",
        ),
        pytest.param(
            {"base_url": "https://a.test", "service_tier": "flex"},
            "service_tier is not used by provider 'anthropic'",
            id="service-tier-on-anthropic",
        ),
        pytest.param(
            {"provider": "vertex", "region": "us-east5", "project": "p", "guardrail": "g", "guardrail_version": "1"},
            "guardrail is not used by provider 'vertex'",
            id="guardrail-on-vertex",
        ),
    ],
)
def test_config_refuses_a_provider_without_its_keys(deployment: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(_config(**deployment), environ={})


def test_config_defaults_a_clouds_endpoint_key_and_price() -> None:
    config = parse_config(_config(provider="bedrock", region="eu-west-1", price={"input": 4, "output": 8}), environ={})
    d = config.models[0].deployments[0]
    assert (d.base_url, d.api_key_env, d.needs_key) == ("https://bedrock-runtime.eu-west-1.amazonaws.com", "", False)
    assert d.price is not None and str(d.price.cache_read) == "0.4"
    vertex = parse_config(_config(provider="vertex", region="global", project="p"), environ={})
    assert vertex.models[0].deployments[0].base_url == "https://aiplatform.googleapis.com"


@pytest.mark.parametrize(
    ("proxy", "environment", "proxies", "trust_env"),
    [
        pytest.param(
            "http://u:p@corp:3128",
            {},
            {"http": "http://u:p@corp:3128", "https": "http://u:p@corp:3128"},
            False,
            id="its-proxy",
        ),
        pytest.param("", {"HTTPS_PROXY": "http://env:3128"}, {}, False, id="no-proxy"),
        pytest.param(None, {"HTTPS_PROXY": "http://env:3128"}, {}, True, id="the-environments"),
    ],
)
def test_vertex_refreshes_its_token_through_the_deployments_egress(
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    proxy: str | None,
    environment: dict[str, str],
    proxies: Any,
    trust_env: bool,
) -> None:
    """google-auth's token refresh is a call out of the network like the deployment's own: the
    deployment's proxy (or the environment's, read by requests per URL), and one TLS context
    with the extra CA files and the client certificate."""
    from ezat_compat.upstream.egress import TLSAdapter, egress_of

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    deployment = replace(VERTEX, proxy=proxy)
    provider: Any = make_provider(deployment, egress_of(deployment))
    session = provider.token_session()
    assert session.trust_env is trust_env
    assert session.proxies == proxies
    assert isinstance(session.get_adapter("https://oauth2.googleapis.com/token"), TLSAdapter)


BASE_PEM = b"-----BEGIN CERTIFICATE-----\nYmFzZQ==\n-----END CERTIFICATE-----\n"
EXTRA_PEM = b"-----BEGIN CERTIFICATE-----\nZXh0cmE=\n-----END CERTIFICATE-----"  # no final newline
CORP = "http://u:p@corp:3128"


def _aws_egress_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The PEM files of a Bedrock deployment's egress and an environment of none but these:
    ``REQUESTS_CA_BUNDLE`` the base bundle, no AWS files, no ``AWS_CA_BUNDLE``."""
    files = {name: tmp_path / f"{name}.pem" for name in ("base", "aws", "extra", "cert", "key")}
    for name, path in files.items():
        path.write_bytes(EXTRA_PEM if name == "extra" else BASE_PEM.replace(b"YmFzZQ==", name.encode()))
    for name in ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTP_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(files["base"]))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return files


@pytest.mark.parametrize(
    ("proxy", "key", "proxies"),
    [
        pytest.param(CORP, True, {"http": CORP, "https": CORP}, id="its-proxy"),
        pytest.param("", True, {}, id="no-proxy-is-direct"),
        pytest.param(None, False, None, id="the-environments-read-by-botocore"),
    ],
)
def test_bedrock_credential_calls_leave_through_the_deployments_egress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proxy: str | None, key: bool, proxies: Any
) -> None:
    """botocore's STS and SSO clients take the session's default client config (proxies, client
    certificate) and its ``ca_bundle``: one file, the base bundle followed by the extra CA."""
    from ezat_compat.upstream.egress import egress_of

    files = _aws_egress_files(tmp_path, monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://env:3128")
    deployment = replace(
        BEDROCK,
        proxy=proxy,
        ca_file=str(files["extra"]),
        client_cert=str(files["cert"]),
        client_key=str(files["key"]) if key else "",
    )
    provider: Any = make_provider(deployment, egress_of(deployment))
    session = provider.credentials_session()
    config = session.get_default_client_config()
    cert = (str(files["cert"]), str(files["key"])) if key else str(files["cert"])
    assert (config.proxies, config.client_cert) == (proxies, cert)
    bundle = Path(session.get_config_variable("ca_bundle"))
    assert bundle.read_bytes() == files["base"].read_bytes() + EXTRA_PEM + b"\n"
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
    # an SSO client as botocore makes it (its own Config merged over the session's default)
    sso = botocore.utils.create_nested_client(
        session, "sso", config=Config(region_name="us-east-1", signature_version=UNSIGNED)
    )
    assert (sso.meta.config.proxies, sso.meta.config.client_cert) == (proxies, cert)


@pytest.mark.parametrize(
    ("aws_ca_bundle", "extra", "expected"),
    [
        pytest.param(False, False, ["base"], id="requests-bundle"),
        pytest.param(True, False, ["aws"], id="aws-ca-bundle-kept"),
        pytest.param(False, True, ["base", "extra"], id="requests-bundle-and-extra"),
        pytest.param(True, True, ["aws", "extra"], id="aws-ca-bundle-and-extra"),
    ],
)
def test_bedrock_credential_calls_trust_one_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aws_ca_bundle: bool, extra: bool, expected: list[str]
) -> None:
    from ezat_compat.upstream.egress import egress_of

    files = _aws_egress_files(tmp_path, monkeypatch)
    if aws_ca_bundle:
        monkeypatch.setenv("AWS_CA_BUNDLE", str(files["aws"]))
    deployment = replace(BEDROCK, ca_file=str(files["extra"]) if extra else "")
    provider: Any = make_provider(deployment, egress_of(deployment))
    session = provider.credentials_session()
    assert session.get_default_client_config() is None  # nothing to set: no proxy key, no certificate
    bundle = session.get_config_variable("ca_bundle")
    if len(expected) == 1:
        assert bundle == str(files[expected[0]])
    else:
        assert Path(bundle).read_bytes() == b"".join(files[name].read_bytes() for name in expected) + b"\n"


def test_bedrock_without_an_egress_leaves_botocore_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _aws_egress_files(tmp_path, monkeypatch)
    provider: Any = make_provider(BEDROCK)
    session = provider.credentials_session()
    assert session.get_default_client_config() is None
    assert session.get_config_variable("ca_bundle") is None


@pytest.mark.parametrize("missing", ["extra", "base", "cert"])
def test_bedrock_names_a_missing_egress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    from ezat_compat.upstream.egress import egress_of
    from ezat_compat.upstream.providers import ProviderSetupError

    files = _aws_egress_files(tmp_path, monkeypatch)
    deployment = replace(BEDROCK, ca_file=str(files["extra"]), client_cert=str(files["cert"]))
    provider: Any = make_provider(deployment, egress_of(deployment))
    files[missing].unlink()
    with pytest.raises(ProviderSetupError, match=f"deployment b: .*{files[missing]}"):
        provider.credentials()


@pytest.mark.parametrize("provider", ["anthropic", "foundry", "bedrock", "vertex"])
def test_the_1m_context_beta_reaches_every_provider(provider: str) -> None:
    """``context-1m-2025-08-07``: Anthropic offers the 1M-token window on Bedrock and Vertex AI
    too (betas.py gives the sources); dropping it would cut a long request at 200k tokens."""
    assert allowed_betas(provider, "claude-code-20250219,context-1m-2025-08-07")[-1] == "context-1m-2025-08-07"


def test_count_tokens_shapes_for_each_cloud() -> None:
    """Bedrock's CountTokens wraps the InvokeModel body it would count (base64, with a
    ``max_tokens`` InvokeModel wants) and answers ``inputTokens``; Vertex AI's
    count-tokens:rawPredict takes the model in the body, without ``stream``."""
    count = "/v1/messages/count_tokens"
    source = {"messages": [{"role": "user", "content": "hi"}], "system": "s"}
    bedrock = make_provider(BEDROCK)
    body, headers = bedrock.shape(encode_body(source), source, None, {"anthropic-beta": BETAS}, count)
    assert headers is None
    invoke = json.loads(base64.b64decode(json.loads(body)["input"]["invokeModel"]["body"]))
    assert invoke == {
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["interleaved-thinking-2025-05-14", "effort-2025-11-24"],
        "max_tokens": 1,
        **source,
    }
    assert bedrock.path(count, False) == "/model/anthropic.claude-x-v1%3A0/count-tokens"
    assert json.loads(bedrock.answer(count, b'{"inputTokens": 12}')) == {"input_tokens": 12}
    assert bedrock.answer("/v1/messages", b'{"inputTokens": 12}') == b'{"inputTokens": 12}'
    vertex = make_provider(VERTEX)
    body, _ = vertex.shape(encode_body(source), source, None, None, count)
    assert json.loads(body) == {"anthropic_version": "vertex-2023-10-16", "model": "claude-x@1", **source}
    assert (
        vertex.path(count, False)
        == "/v1/projects/p/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
    )


def test_the_simulated_count_tokens_takes_a_whole_invoke_model_body() -> None:
    """CountTokens counts an InvokeModel body "formatted according to the model's expected input
    format": without ``max_tokens`` Bedrock refuses it as it refuses such an InvokeModel."""
    invoke = {"anthropic_version": "bedrock-2023-05-31", "messages": [{"role": "user", "content": "hi"}]}

    def wrapped(body: dict[str, Any]) -> dict[str, Any]:
        return {"input": {"invokeModel": {"body": base64.b64encode(json.dumps(body).encode()).decode()}}}

    assert clouds.count_tokens_input("anthropic.claude-x", wrapped({**invoke, "max_tokens": 1}))["max_tokens"] == 1
    with pytest.raises(clouds.CloudError) as caught:
        clouds.count_tokens_input("anthropic.claude-x", wrapped(invoke))
    assert caught.value.status == 400 and caught.value.body == {"message": clouds.MISSING_MAX_TOKENS}
    with pytest.raises(clouds.CloudError) as profile:
        clouds.count_tokens_input("us.anthropic.claude-x", wrapped({**invoke, "max_tokens": 1}))
    assert profile.value.status == 400


def test_no_provider_takes_a_beta_its_cloud_was_seen_refusing() -> None:
    """The simulator's own record of refusals (each with its public thread) against the gateway's
    allow-lists: a value added to a list that the cloud refuses fails here, and the simulated
    cloud answers it as the real one does ("invalid beta flag", "Unexpected value(s)")."""
    from ezat_compat.sim.clouds import BEDROCK_REFUSED_BETAS, VERTEX_REFUSED_BETAS
    from ezat_compat.upstream.providers.betas import BEDROCK_BETAS, VERTEX_BETAS

    assert BEDROCK_REFUSED_BETAS and not BEDROCK_BETAS & BEDROCK_REFUSED_BETAS
    assert VERTEX_REFUSED_BETAS and not VERTEX_BETAS & VERTEX_REFUSED_BETAS


@pytest.mark.parametrize(
    ("provider", "model", "takes"),
    [
        ("bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", True),
        ("bedrock", "anthropic.claude-opus-4-6-v1", True),
        ("bedrock", "anthropic.claude-sonnet-5-5-v1:0", False),
        ("bedrock", "global.anthropic.claude-opus-4-7", False),
        ("bedrock", "anthropic.claude-haiku-4-5-20251001-v1:0", False),
        ("vertex", "claude-sonnet-5-5", True),
        ("foundry", "claude-sonnet-5-5", True),
        ("anthropic", "claude-haiku-4-5", True),
    ],
)
def test_which_deployments_take_output_config_format(provider: str, model: str, takes: bool) -> None:
    from ezat_compat.sim.clouds import refuses_output_format
    from ezat_compat.upstream.providers.betas import takes_output_format

    assert takes_output_format(provider, model) is takes
    if provider == "bedrock":  # the simulator's own record of Bedrock's refusals agrees
        assert refuses_output_format(model) is not takes


FORMAT = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        pytest.param(None, [], id="no system"),
        pytest.param("be brief", [{"type": "text", "text": "be brief"}], id="a string"),
        pytest.param(
            [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            id="blocks, their breakpoint kept",
        ),
    ],
)
def test_a_format_bedrock_refuses_is_told_as_the_last_system_block(system: Any, expected: list[Any]) -> None:
    from ezat_compat.upstream.providers.betas import format_instruction, told_format

    body: dict[str, Any] = {"max_tokens": 9, "messages": [], "output_config": {"effort": "low", "format": FORMAT}}
    if system is not None:
        body["system"] = system
    out = told_format(body)
    told = {"type": "text", "text": format_instruction(FORMAT)}
    assert out["output_config"] == {"effort": "low"}
    assert out["system"] == [*expected, told]
    assert '{"type":"object","properties":{"a":{"type":"integer"}}}' in told["text"]
    assert body["output_config"] == {"effort": "low", "format": FORMAT}  # the request's own body is unchanged
    assert "output_config" not in told_format({"output_config": {"format": FORMAT}})
    assert told_format({"system": "s"}) == {"system": "s"}  # nothing to tell


def test_bedrock_tells_the_format_only_to_models_that_refuse_it() -> None:
    body = {"max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], "output_config": {"format": FORMAT}}
    for upstream, sent_format in (
        ("anthropic.claude-sonnet-5-5-v1:0", False),
        ("anthropic.claude-sonnet-4-5-v1:0", True),
    ):
        shaped, _ = make_provider(replace(BEDROCK, upstream_model=upstream)).shape(b"", body, False, None)
        sent = json.loads(shaped)
        assert ("output_config" in sent) is sent_format
        assert ("system" in sent) is not sent_format


def test_bedrock_sends_and_signs_its_invocation_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guardrail and a service tier go as InvokeModel's header fields (botocore's service
    model), signed with the rest: the simulator, verifying, recomputes the signature over them."""
    deployment = replace(BEDROCK, guardrail="gr-abc", guardrail_version="DRAFT", service_tier="flex")
    provider = make_provider(deployment)
    headers = provider.headers(None, "application/json")
    assert headers["x-amzn-bedrock-guardrailidentifier"] == "gr-abc"
    assert headers["x-amzn-bedrock-guardrailversion"] == "DRAFT"
    assert headers["x-amzn-bedrock-service-tier"] == "flex"
    assert "x-amzn-bedrock-service-tier" not in make_provider(BEDROCK).headers(None, "application/json")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", clouds.SIM_AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", clouds.SIM_AWS_SECRET_ACCESS_KEY)
    assert provider.describe()[1:3] == ["guardrail gr-abc version DRAFT", "service tier flex"]
    body = b'{"max_tokens": 1}'
    request = requests.Request("POST", "http://127.0.0.1:9/model/m/invoke", data=body, headers=headers).prepare()
    provider.authorize(request)
    signed = request.headers["Authorization"].split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    assert {"x-amzn-bedrock-guardrailidentifier", "x-amzn-bedrock-service-tier"} <= set(signed)
    lower = {k.lower(): v for k, v in request.headers.items()}
    clouds.verify_sigv4("POST", request.url or "", lower, body)  # raises when it doesn't verify
    lower["x-amzn-bedrock-service-tier"] = "priority"  # changed after signing: refused
    with pytest.raises(clouds.CloudError):
        clouds.verify_sigv4("POST", request.url or "", lower, body)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, (False, "default")),
        ({"x-amzn-bedrock-service-tier": "flex"}, (False, "flex")),
        (
            {
                "content-type": "application/json",
                "x-amzn-bedrock-guardrailidentifier": "g",
                "x-amzn-bedrock-guardrailversion": "1",
            },
            (True, "default"),
        ),
        (
            {
                "content-type": "text/plain",
                "x-amzn-bedrock-guardrailidentifier": "g",
                "x-amzn-bedrock-guardrailversion": "1",
            },
            "content type to be application/json",
        ),
        ({"x-amzn-bedrock-service-tier": "cheap"}, "failed to satisfy constraint: Member must satisfy enum value set"),
        (
            {"content-type": "application/json", "x-amzn-bedrock-guardrailidentifier": "g"},
            "Guardrail version is required",
        ),
    ],
)
def test_the_simulated_bedrock_reads_invocation_options(headers: dict[str, str], expected: Any) -> None:
    if isinstance(expected, tuple):
        assert clouds.invoke_options(headers) == expected
        return
    with pytest.raises(clouds.CloudError) as refused:
        clouds.invoke_options(headers)
    assert refused.value.status == 400 and expected in refused.value.body["message"]
