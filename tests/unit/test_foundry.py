"""Microsoft Foundry's two options per deployment: its hosting (a deployment "Hosted on Azure"
is passed over for the features it refuses, or the request is a 400 naming them) and its
authentication (Microsoft Entra ID through azure-identity, against a token endpoint on loopback:
the bearer on each request, the token cached and taken again before it expires)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from ezat_compat.config import ConfigError, parse_config
from ezat_compat.domain import Deployment
from ezat_compat.errors import InvalidRequestError, UpstreamAuthError
from ezat_compat.sim.validate import azure_refusal
from ezat_compat.upstream.egress import egress_of
from ezat_compat.upstream.providers import make_provider
from ezat_compat.upstream.providers.features import (
    AZURE_FOUNDRY,
    FILE_SOURCES,
    OUTPUT_FORMAT,
    STRICT_TOOLS,
    declared,
    provider_of,
    refusal,
    takers,
)
from ezat_compat.upstream.providers.foundry import REFRESH_BEFORE_S, SCOPE, FoundryEntraProvider
from tests.support.deployments import BEDROCK
from tests.support.entra import CLIENT_ID, CLIENT_SECRET, TENANT, EntraEndpoint

ANTHROPIC = Deployment(name="a", base_url="http://127.0.0.1:9", upstream_model="claude-x", api_key_env="K")
AZURE = replace(ANTHROPIC, name="fa", provider="foundry")  # hosting: "azure", the default
HOSTED_BY_ANTHROPIC = replace(AZURE, name="fh", hosting="anthropic")
USER = {"role": "user", "content": "hi"}
FILE_DOC = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}

# (id, body, what the Azure-hosted deployment refuses)
FEATURES = [
    ("json-schema", {"output_config": {"format": {"type": "json_schema", "schema": {}}}}, OUTPUT_FORMAT),
    ("strict-tool", {"tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": True}]}, STRICT_TOOLS),
    ("web-search", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ("web-fetch", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, "web_fetch_20250910"),
    ("code-execution", {"tools": [{"type": "code_execution_20250825", "name": "c"}]}, "code_execution_20250825"),
    ("tool-search", {"tools": [{"type": "tool_search_tool_regex_20251119", "name": "t"}]},
     "tool_search_tool_regex_20251119"),
    ("mcp-connector", {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}]}, "mcp_servers"),
    ("mcp-toolset", {"tools": [{"type": "mcp_toolset", "mcp_server_name": "m"}]}, "mcp_toolset"),
    ("files-api", {"messages": [{"role": "user", "content": [FILE_DOC]}]}, FILE_SOURCES),
    ("files-api-in-a-tool-result", {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [FILE_DOC]}]}]}, FILE_SOURCES),
]  # fmt: skip


@pytest.mark.parametrize(("body", "kind"), [r[1:] for r in FEATURES], ids=[r[0] for r in FEATURES])
def test_foundry_hosted_on_azure_is_passed_over_for_what_it_refuses(body: dict[str, Any], kind: str) -> None:
    wanted = declared(body)
    assert refusal(AZURE_FOUNDRY, wanted) == kind
    assert refusal("foundry", wanted) is None and refusal("anthropic", wanted) is None
    every = (AZURE, HOSTED_BY_ANTHROPIC, ANTHROPIC)
    assert takers("m", every, body) == (HOSTED_BY_ANTHROPIC, ANTHROPIC)
    with pytest.raises(InvalidRequestError) as caught:
        takers("m", (AZURE,), body)
    assert caught.value.message == (
        f"Model m can't use {kind}: its deployments are on Foundry hosted on Azure, which doesn't offer it. "
        "Leave it out, or use a model served by Anthropic's API."
    )
    assert azure_refusal({"messages": [USER], **body}) is not None  # and the simulated one refuses it too


def test_what_only_foundry_on_azure_refuses_is_no_concern_of_the_clouds() -> None:
    assert provider_of(AZURE) == AZURE_FOUNDRY and provider_of(HOSTED_BY_ANTHROPIC) == "foundry"
    assert refusal("bedrock", (OUTPUT_FORMAT, STRICT_TOOLS, FILE_SOURCES)) is None  # Bedrock tells the schema instead
    plain = {"messages": [USER], "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    assert declared(plain) == () and azure_refusal(plain) is None
    both = (BEDROCK, AZURE)
    assert takers("m", both, {"output_config": {"format": {"type": "json_schema", "schema": {}}}}) == (BEDROCK,)


# ---------------------------------------------------------------- configuration


def _config(**deployment: Any) -> dict[str, Any]:
    base = {"name": "f", "upstream_model": "claude-x", "provider": "foundry", "base_url": "https://r.test/anthropic"}
    return {"models": [{"id": "m", "aliases": [], "price": {"input": 1, "output": 2}, "deployments": [
        {**base, **deployment}]}]}  # fmt: skip


def test_config_defaults_foundry_to_hosted_on_azure_with_its_key() -> None:
    d = parse_config(_config(), environ={"ANTHROPIC_FOUNDRY_API_KEY": "k"}).models[0].deployments[0]
    assert (d.hosting, d.auth, d.api_key, d.needs_key) == ("azure", "api_key", "k", True)


def test_config_takes_entra_id_with_a_service_principal() -> None:
    config = _config(auth="entra_id", tenant_id=TENANT, client_id=CLIENT_ID, client_secret_env="S", hosting="anthropic")
    d = parse_config(config, environ={"S": "shh", "ANTHROPIC_FOUNDRY_API_KEY": "k"}).models[0].deployments[0]
    assert (d.auth, d.hosting, d.client_secret, d.api_key_env, d.api_key, d.needs_key) == (
        "entra_id",
        "anthropic",
        "shh",
        "",
        "",
        False,
    )
    assert "shh" not in repr(d)


@pytest.mark.parametrize(
    ("deployment", "problem"),
    [
        pytest.param({"hosting": "azure", "provider": "anthropic"}, "hosting is not used by provider 'anthropic'"),
        pytest.param({"auth": "entra_id", "provider": "anthropic"}, "auth is not used by provider 'anthropic'"),
        pytest.param({"hosting": "aws"}, "Must be one of"),
        pytest.param({"tenant_id": TENANT}, 'used only with auth = "entra_id"'),
        pytest.param({"auth": "entra_id", "api_key_env": "K"}, "not a key"),
        pytest.param({"auth": "entra_id", "client_secret_env": "S"}, "needs tenant_id and client_id"),
        pytest.param({"auth": "entra_id", "authority_host": "http://127.0.0.1:1"}, "authority_host"),
        pytest.param({"anthropic_version": "2024-01-01"}, "Must be one of"),
    ],
)
def test_config_refuses_foundry_keys_that_would_do_nothing(deployment: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(_config(**deployment), environ={})


# ---------------------------------------------------------------- Entra ID on loopback


@pytest.fixture
def entra(tmp_path: Path) -> Iterator[EntraEndpoint]:
    endpoint = EntraEndpoint(tmp_path).start()
    try:
        yield endpoint
    finally:
        endpoint.stop()


def _entra_deployment(entra: EntraEndpoint, secret_env: str = "FOUNDRY_SECRET") -> Deployment:
    return replace(
        AZURE,
        api_key_env="",
        auth="entra_id",
        tenant_id=TENANT,
        client_id=CLIENT_ID,
        client_secret_env=secret_env,
        client_secret=CLIENT_SECRET if secret_env == "FOUNDRY_SECRET" else "wrong",
        authority_host=entra.url,
        ca_file=entra.ca_file,  # the token endpoint's certificate: trusted through the deployment's egress
        proxy="",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _bearer(provider: FoundryEntraProvider) -> str:
    request = requests.Request("POST", "http://127.0.0.1:9/anthropic/v1/messages", data=b"{}").prepare()
    provider.authorize(request)
    return str(request.headers["Authorization"])


def test_entra_id_with_a_client_secret_sends_the_bearer_and_no_key(entra: EntraEndpoint) -> None:
    deployment = _entra_deployment(entra)
    provider = make_provider(deployment, egress_of(deployment))
    assert isinstance(provider, FoundryEntraProvider) and provider.rewrites
    assert _bearer(provider) == "Bearer entra-token-1"
    (grant,) = entra.grants
    assert grant["grant_type"] == ["client_credentials"] and grant["scope"] == [SCOPE]
    headers = provider.headers({"anthropic-version": "2026-10-21"}, "application/json")
    assert "x-api-key" not in headers and headers["anthropic-version"] == "2023-06-01"
    assert provider.path("/v1/messages", True) == "/v1/messages"
    assert any("service principal" in line for line in provider.describe())


def test_the_token_is_cached_and_taken_again_before_it_expires(entra: EntraEndpoint) -> None:
    deployment = _entra_deployment(entra)
    clock = Clock()
    provider = FoundryEntraProvider(deployment, egress_of(deployment), clock=clock)
    assert _bearer(provider) == _bearer(provider) == "Bearer entra-token-1"
    assert len(entra.grants) == 1  # one token for both requests
    expires = provider._expires
    clock.now = expires - REFRESH_BEFORE_S - 1
    assert _bearer(provider) == "Bearer entra-token-1" and len(entra.grants) == 1
    entra.token = "entra-token-2"
    clock.now = expires - REFRESH_BEFORE_S + 1  # within the margin: a new one, before the old lapses
    provider._credential = None  # azure-identity's own cache would answer with the old token
    assert _bearer(provider) == "Bearer entra-token-2" and len(entra.grants) == 2


def test_a_refused_secret_is_an_auth_failure_naming_the_deployment(entra: EntraEndpoint) -> None:
    deployment = _entra_deployment(entra, secret_env="WRONG")
    provider = make_provider(deployment, egress_of(deployment))
    with pytest.raises(UpstreamAuthError, match="the Entra ID token of fa could not be had"):
        _bearer(provider)
