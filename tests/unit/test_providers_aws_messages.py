"""Claude Platform on AWS and Bedrock's Messages endpoint (``upstream/providers/aws_messages.py``):
the request each is sent, its signature (recomputed by the simulator with botocore, for the right
service and region), its key, the workspace header, and the configuration that reaches them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import requests

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.domain import Deployment
from ezat_compat.endpoints import COUNT_TOKENS, offers
from ezat_compat.sim import clouds
from ezat_compat.translate.versions import V2026, offers_version
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.aws_messages import (
    BedrockMessagesProvider,
    ClaudePlatformAwsProvider,
    signing_service,
)
from ezat_compat.upstream.providers.betas import allowed_betas, takes_url_sources
from ezat_compat.upstream.providers.features import refusal

PLATFORM = Deployment(
    name="cpa",
    base_url="http://127.0.0.1:9/claude-platform-aws",
    upstream_model="claude-sonnet-5-5",
    provider="claude_platform_aws",
    region="us-west-2",
    workspace_id=clouds.SIM_AWS_WORKSPACE_ID,
    api_key_env="",
)
MANTLE = Deployment(
    name="mantle",
    base_url="http://127.0.0.1:9/bedrock-mantle/anthropic",
    upstream_model="anthropic.claude-sonnet-5-5",
    provider="bedrock_messages",
    region="us-east-1",
    api_key_env="",
)
RUNTIME = replace(MANTLE, name="runtime", base_url="https://bedrock-runtime.us-east-1.amazonaws.com/anthropic")
CLAUDE_CODE_BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", clouds.SIM_AWS_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", clouds.SIM_AWS_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


def _sent(deployment: Deployment, body: bytes = b'{"max_tokens":1}', path: str = "/v1/messages") -> Any:
    provider = make_provider(deployment)
    headers = provider.headers({"anthropic-beta": CLAUDE_CODE_BETAS}, "text/event-stream")
    request = requests.Request("POST", deployment.base_url + provider.path(path, True), data=body, headers=headers)
    prepared = request.prepare()
    provider.authorize(prepared)
    return prepared


def _lower(request: requests.PreparedRequest) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


@pytest.mark.parametrize(
    ("deployment", "service"),
    [
        pytest.param(PLATFORM, "aws-external-anthropic", id="claude-platform-aws"),
        pytest.param(MANTLE, "bedrock-mantle", id="bedrock-mantle"),
        pytest.param(RUNTIME, "bedrock", id="bedrock-runtime"),
    ],
)
def test_each_endpoint_is_signed_for_its_service_and_region(
    aws_env: None, deployment: Deployment, service: str
) -> None:
    assert signing_service(deployment) == service
    request = _sent(deployment)
    headers = _lower(request)
    scope = headers["authorization"].split("Credential=", 1)[1].split(",", 1)[0].split("/")
    assert scope[0] == clouds.SIM_AWS_ACCESS_KEY_ID and scope[2:4] == [deployment.region, service]
    signed = headers["authorization"].split("SignedHeaders=", 1)[1].split(",", 1)[0].split(";")
    assert {"anthropic-version", "content-type", "host", "x-amz-date"} <= set(signed)
    clouds.verify_sigv4("POST", request.url or "", headers, request.body, service=service)
    other = "bedrock" if service != "bedrock" else "bedrock-mantle"
    with pytest.raises(clouds.CloudError):  # a signature for another service is refused
        clouds.verify_sigv4("POST", request.url or "", headers, request.body, service=other)


def test_claude_platform_sends_its_workspace_signed_and_anthropics_request(aws_env: None) -> None:
    request = _sent(PLATFORM)
    headers = _lower(request)
    assert headers["anthropic-workspace-id"] == clouds.SIM_AWS_WORKSPACE_ID
    assert headers["anthropic-version"] == "2023-06-01" and "x-api-key" not in headers
    assert headers["anthropic-beta"] == CLAUDE_CODE_BETAS  # Anthropic's API: the betas pass
    assert request.url == "http://127.0.0.1:9/claude-platform-aws/v1/messages"
    assert "anthropic-workspace-id" in headers["authorization"].split("SignedHeaders=", 1)[1]
    url, body = request.url or "", request.body
    clouds.check_aws_caller(clouds.CLAUDE_PLATFORM_AWS, url, headers, body, None)
    with pytest.raises(clouds.CloudError) as refused:  # the workspace is signed: changed, the signature fails
        clouds.check_aws_caller(
            clouds.CLAUDE_PLATFORM_AWS, url, {**headers, "anthropic-workspace-id": "wrkspc_other"}, body, None
        )
    assert refused.value.status == 403 and clouds.BAD_SIGNATURE in dict(refused.value.headers)["x-amzn-ErrorType"]


@pytest.mark.parametrize(
    ("workspace", "status", "words"),
    [
        pytest.param(None, 400, "Missing required header: anthropic-workspace-id", id="missing"),
        pytest.param("wrkspc_other", 403, "not authorized to use workspace wrkspc_other", id="another"),
    ],
)
def test_the_simulated_claude_platform_wants_its_workspace(workspace: str | None, status: int, words: str) -> None:
    headers = {"x-api-key": "k"} | ({"anthropic-workspace-id": workspace} if workspace else {})
    with pytest.raises(clouds.CloudError) as refused:
        clouds.check_aws_caller(clouds.CLAUDE_PLATFORM_AWS, "http://sim.test/", headers, b"", None)
    assert refused.value.status == status and words in refused.value.body["message"]
    shaped, forwarded = make_provider(PLATFORM).shape(b'{"max_tokens":1}', None, True, {"anthropic-beta": "x"})
    assert json.loads(shaped) == {"model": "claude-sonnet-5-5", "stream": True, "max_tokens": 1}
    assert forwarded == {"anthropic-beta": "x"}


@pytest.mark.parametrize(
    ("deployment", "header", "value"),
    [
        pytest.param(PLATFORM, "x-api-key", "k-1", id="claude-platform-workspace-key"),
        pytest.param(MANTLE, "authorization", "Bearer k-1", id="bedrock-api-key"),
    ],
)
def test_a_key_goes_instead_of_a_signature(deployment: Deployment, header: str, value: str) -> None:
    keyed = replace(deployment, api_key_env="K", api_key="k-1")
    request = _sent(keyed)
    headers = _lower(request)
    assert headers[header] == value and "x-amz-date" not in headers
    prefix = clouds.CLAUDE_PLATFORM_AWS if deployment is PLATFORM else clouds.BEDROCK_MANTLE
    clouds.check_aws_caller(prefix, request.url or "", headers, b"", "k-1")
    with pytest.raises(clouds.CloudError):
        clouds.check_aws_caller(prefix, request.url or "", headers, b"", "another-key")


def test_bedrock_messages_body_is_anthropics_with_bedrocks_rules() -> None:
    provider = make_provider(MANTLE)
    assert isinstance(provider, BedrockMessagesProvider)
    source = {
        "max_tokens": 10,
        "speed": "fast",
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "messages": [{"role": "user", "content": "hi"}],
    }
    shaped, headers = provider.shape(b"", source, True, {"anthropic-beta": CLAUDE_CODE_BETAS})
    sent = json.loads(shaped)
    assert sent["model"] == "anthropic.claude-sonnet-5-5" and sent["stream"] is True
    assert "speed" not in sent  # its beta isn't Bedrock's: the field goes with it
    assert "output_config" not in sent and "JSON Schema" in sent["system"][-1]["text"]  # told, as on Bedrock
    assert headers == {"anthropic-beta": "interleaved-thinking-2025-05-14"}
    counted, _ = provider.shape(b"", {"messages": [], "stream": True}, None, None, COUNT_TOKENS)
    assert json.loads(counted) == {"model": "anthropic.claude-sonnet-5-5", "messages": []}
    old = make_provider(replace(MANTLE, upstream_model="anthropic.claude-3-7-sonnet-20250219-v1:0"))
    marked = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
    assert json.loads(old.shape(b"", marked, False, None)[0])["system"][0]["cache_control"] == {"type": "ephemeral"}


def test_the_rules_of_each_new_provider_are_data() -> None:
    assert allowed_betas("claude_platform_aws", CLAUDE_CODE_BETAS) == CLAUDE_CODE_BETAS.split(",")
    assert allowed_betas("bedrock_messages", CLAUDE_CODE_BETAS) == ["interleaved-thinking-2025-05-14"]
    assert takes_url_sources("claude_platform_aws") and not takes_url_sources("bedrock_messages")
    assert refusal("bedrock_messages", ["web_search_20250305"]) == "web_search_20250305"
    assert refusal("claude_platform_aws", ["web_search_20250305", "mcp_servers"]) is None
    assert offers("claude_platform_aws", "/v1/messages/batches") and offers("bedrock_messages", COUNT_TOKENS)
    assert offers_version("claude_platform_aws", "claude-sonnet-4-5", V2026)
    assert not offers_version("bedrock_messages", "anthropic.claude-sonnet-4-5-20250929-v1:0", V2026)
    assert offers_version("bedrock_messages", "anthropic.claude-opus-4-7", V2026)


def test_aws_errors_become_anthropics_and_anthropics_pass() -> None:
    provider = make_provider(PLATFORM)
    refused = clouds.bedrock_error(403, "The request signature we calculated does not match", clouds.BAD_SIGNATURE)
    error = provider.status_error(403, json.dumps(refused.body).encode(), dict(refused.headers))
    assert error.status_code == 403 and json.loads(error.body)["error"]["type"] == "permission_error"
    own = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    assert provider.status_error(529, own, {}).body == own


def _config(**deployment: Any) -> dict[str, Any]:
    return {
        "models": [
            {
                "id": "m",
                "aliases": [],
                "price": {"input": 1, "output": 2},
                "deployments": [{"name": "d", "upstream_model": "claude-opus-4-7", **deployment}],
            }
        ]
    }


@pytest.mark.parametrize(
    ("deployment", "problem"),
    [
        pytest.param({"provider": "claude_platform_aws", "workspace_id": "w"}, "needs region", id="no-region"),
        pytest.param({"provider": "claude_platform_aws", "region": "us-west-2"}, "needs workspace_id", id="no-ws"),
        pytest.param({"provider": "bedrock_messages"}, "needs region", id="mantle-without-region"),
        pytest.param(
            {"provider": "bedrock_messages", "region": "us-east-1", "workspace_id": "w"},
            "workspace_id is not used by provider 'bedrock_messages'",
            id="stray-workspace",
        ),
        pytest.param(
            {"provider": "bedrock_messages", "region": "us-east-1", "project": "p"},
            "project is not used",
            id="stray-project",
        ),
        pytest.param(
            {"provider": "bedrock_messages", "region": "us-east-1", "upstream_model": "anthropic.claude-sonnet-4-5"}
            | {"anthropic_version": "2026-10-21"},
            "does not serve 2026-10-21",
            id="mantle-version-by-model",
        ),
        pytest.param(
            {"provider": "claude_platform_aws", "region": "us-west-2", "workspace_id": "w", "workspace": "w"},
            "Unknown field",
            id="unknown-key",
        ),
    ],
)
def test_config_refuses_what_the_new_providers_cant_use(deployment: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(_config(**deployment))


def test_config_defaults_each_new_providers_endpoint() -> None:
    platform = parse_config(
        _config(provider="claude_platform_aws", region="us-west-2", workspace_id="wrkspc_1", anthropic_version=V2026)
    )
    mantle = parse_config(_config(provider="bedrock_messages", region="eu-west-1", anthropic_version=V2026))
    (d,) = platform.models[0].deployments
    (m,) = mantle.models[0].deployments
    assert d.base_url == "https://aws-external-anthropic.us-west-2.api.aws" and d.workspace_id == "wrkspc_1"
    assert m.base_url == "https://bedrock-mantle.eu-west-1.api.aws/anthropic" and not m.needs_key
    assert not d.needs_key and d.anthropic_version == V2026
    assert isinstance(make_provider(d), ClaudePlatformAwsProvider)


@pytest.mark.parametrize("deployment", [PLATFORM, MANTLE], ids=["claude-platform-aws", "bedrock-mantle"])
def test_the_credential_calls_leave_through_the_deployments_egress(deployment: Deployment) -> None:
    """botocore's STS and SSO clients for these credentials take the deployment's proxy, as
    Bedrock's do (``aws.py``, shared)."""
    from ezat_compat.upstream.egress import egress_of

    proxied = replace(deployment, proxy="http://corp-proxy.test:3128")
    provider: Any = make_provider(proxied, egress_of(proxied))
    session = provider._aws.session()
    proxy = "http://corp-proxy.test:3128"
    assert session.get_default_client_config().proxies == {"http": proxy, "https": proxy}
    direct = replace(deployment, proxy="")
    assert make_provider(direct, egress_of(direct))._aws.session().get_default_client_config().proxies == {}
