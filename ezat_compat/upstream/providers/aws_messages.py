"""Anthropic's Messages API on AWS endpoints: Claude Platform on AWS and Bedrock's Messages
endpoint. Both take Anthropic's body as it is (``model`` in it), answer in Anthropic's JSON and
SSE (not event-stream), take ``anthropic-version`` as a header and are signed with SigV4 by
botocore's credential chain (``aws.py``), or take a key instead.

Claude Platform on AWS (``provider = "claude_platform_aws"``): Anthropic's API operated by
Anthropic, with AWS's authentication and billing (AWS, "Claude Platform on AWS User Guide",
"Making requests": "The differences are the base URL, the authentication method, and a required
``anthropic-workspace-id`` header").

- ``https://aws-external-anthropic.{region}.api.aws/v1/messages`` (and ``/v1/messages/count_tokens``,
  the same API surface as Anthropic's).
- SigV4 for the service ``aws-external-anthropic`` (the same page's ``curl --aws-sigv4
  "aws:amz:us-west-2:aws-external-anthropic"``; the Anthropic Python SDK's ``AnthropicAWS``,
  ``anthropic/lib/aws/_client.py``, signs with ``service_name="aws-external-anthropic"``), or a
  workspace's API key in ``x-api-key`` (the SDK's API-key mode uses Anthropic's own key header;
  its variable is ``ANTHROPIC_AWS_API_KEY``).
- ``anthropic-workspace-id: <workspace_id>`` on every request (the SDK sends it always and
  refuses to start without one).
- Features, betas and versions: Anthropic's API's ("the same models and features as the Claude
  API on the same release schedule": Claude Code's "Claude Platform on AWS" page), so no row of
  ``features.py`` or ``betas.py`` restricts it; it serves 2026-10-21 (``translate/versions.py``).

Bedrock's Messages endpoint (``provider = "bedrock_messages"``): Amazon Bedrock serving
Anthropic's Messages API (Bedrock user guide, "Inference using Anthropic Messages API").

- ``https://bedrock-mantle.{region}.api.aws/anthropic/v1/messages`` by default, or, with
  ``base_url`` on bedrock-runtime, ``https://bedrock-runtime.{region}.amazonaws.com/anthropic``
  (the same guide's two endpoints). ``/v1/messages/count_tokens`` is served there too (the
  Anthropic Python SDK's Mantle client, ``anthropic/lib/bedrock/_mantle.py``, routes it).
- ``upstream_model`` is Bedrock's model id or inference profile, in the body's ``model``.
- SigV4 for the service ``bedrock-mantle`` (the SDK's Mantle client: ``DEFAULT_SERVICE_NAME =
  "bedrock-mantle"``), or ``bedrock`` on bedrock-runtime (botocore's bedrock-runtime service
  model, its signing name); or a Bedrock API key as ``Authorization: Bearer`` (the same client's
  API-key mode, ``AWS_BEARER_TOKEN_BEDROCK``).
- It is Bedrock: the betas, tools, structured outputs, cache TTLs and API versions of Bedrock's
  rows in ``betas.py``, ``features.py`` and ``translate/versions.py`` apply (AWS documents no
  difference between its endpoints for a model; where it does, the row says so).

Errors: Anthropic's envelope passes as it came; AWS's own (``{"message": …}`` with
``x-amzn-ErrorType``, such as a refused signature) are mapped as Bedrock's (``bedrock.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import requests

from ezat_compat.domain import Deployment
from ezat_compat.endpoints import COUNT_TOKENS, MESSAGES
from ezat_compat.errors import UpstreamStatusError
from ezat_compat.translate.cache_marks import without_ttl
from ezat_compat.upstream.bodies import encode_body, with_model
from ezat_compat.upstream.egress import Egress
from ezat_compat.upstream.providers import Provider, _filtered_beta_header, beta_list, common_headers
from ezat_compat.upstream.providers.aws import AwsCredentials, needs_botocore
from ezat_compat.upstream.providers.bedrock import aws_status_error
from ezat_compat.upstream.providers.betas import takes_cache_ttl, takes_output_format, told_format
from ezat_compat.upstream.providers.features import drop_gated_fields

PLATFORM_SERVICE = "aws-external-anthropic"
MANTLE_SERVICE = "bedrock-mantle"
RUNTIME_SERVICE = "bedrock"
WORKSPACE_HEADER = "anthropic-workspace-id"
# The header fields signed besides host and X-Amz-Date (botocore adds those): the body's type,
# the version and the workspace, so that none can be changed on the way.
SIGNED_HEADERS = frozenset({"content-type", "accept", "anthropic-version", "anthropic-beta", WORKSPACE_HEADER})


def _signed(name: str) -> bool:
    return name in SIGNED_HEADERS


def signing_service(deployment: Deployment) -> str:
    """The SigV4 service a deployment's requests are signed for (module docstring)."""
    if deployment.provider == "claude_platform_aws":
        return PLATFORM_SERVICE
    return RUNTIME_SERVICE if "bedrock-runtime" in deployment.base_url else MANTLE_SERVICE


class AwsMessagesProvider(Provider):
    """Anthropic's Messages API on an AWS endpoint (module docstring): the body with ``model``,
    SSE, the deployment's ``anthropic-version``; SigV4, unless a key is configured."""

    __slots__ = ("_aws", "_service")
    rewrites = True  # ``authorize`` signs each request

    def __init__(self, deployment: Deployment, egress: Egress | None = None) -> None:
        needs_botocore(deployment)
        super().__init__(deployment)
        self._aws = AwsCredentials(deployment, egress)
        self._service = signing_service(deployment)

    def path(self, path: str, stream: bool) -> str:
        return path

    def key_header(self) -> tuple[str, str]:
        """The header field that carries the deployment's key (when it has one)."""
        return "x-api-key", self.deployment.api_key

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = common_headers(accept)
        if self.deployment.api_key:
            name, value = self.key_header()
            headers[name] = value
        if extra:
            headers.update(extra)
        headers["anthropic-version"] = self.deployment.anthropic_version  # never the client's
        return headers

    def authorize(self, request: requests.PreparedRequest) -> None:
        if self.deployment.api_key:
            return  # the key is in the header fields
        self._aws.sign(request, self._service, _signed)

    def status_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
        return aws_status_error(status, body, headers)

    def _credentials_line(self) -> str:
        d = self.deployment
        if d.api_key_env:
            return f"credentials: key from {d.api_key_env}" + ("" if d.api_key else " (not set)")
        return self._aws.describe()


class ClaudePlatformAwsProvider(AwsMessagesProvider):
    """Claude Platform on AWS (module docstring): Anthropic's API with its workspace header."""

    __slots__ = ()
    name = "claude_platform_aws"

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = super().headers(extra, accept)
        headers[WORKSPACE_HEADER] = self.deployment.workspace_id
        return headers

    def describe(self) -> list[str]:
        d = self.deployment
        where = f"region {d.region}, workspace {d.workspace_id}, model {d.upstream_model}"
        return [f"provider: Claude Platform on AWS, {where}", self._credentials_line()]


class BedrockMessagesProvider(AwsMessagesProvider):
    """Bedrock's Messages endpoint (module docstring): Bedrock's rules on Anthropic's body."""

    __slots__ = ("_no_ttl", "_told_format")
    name = "bedrock_messages"

    def __init__(self, deployment: Deployment, egress: Egress | None = None) -> None:
        super().__init__(deployment, egress)
        self._no_ttl = not takes_cache_ttl(self.name, deployment.upstream_model)
        self._told_format = not takes_output_format(self.name, deployment.upstream_model)

    def key_header(self) -> tuple[str, str]:
        return "authorization", f"Bearer {self.deployment.api_key}"

    def shape(
        self,
        body: bytes,
        source: Mapping[str, Any] | None,
        stream: bool | None,
        headers: Mapping[str, str] | None,
        path: str = MESSAGES,
    ) -> tuple[bytes, Mapping[str, str] | None]:
        data = dict(self.versioned(source if source is not None else json.loads(body)))
        data.pop("model", None)
        if path == COUNT_TOKENS:
            data.pop("stream", None)
        elif stream is not None:
            data["stream"] = stream
        out = drop_gated_fields(data, beta_list(self.name, headers))  # a field whose beta Bedrock doesn't take
        if self._told_format:
            out = told_format(out)  # the model's copy of the schema on Bedrock refuses the field
        if self._no_ttl:  # an older model: its cache marks go with the default five minutes
            out = {k: without_ttl(v) if k in ("system", "tools", "messages") else v for k, v in out.items()}
        return with_model(encode_body(out), self.model), _filtered_beta_header(self.name, headers)

    def describe(self) -> list[str]:
        d = self.deployment
        return [
            f"provider: Bedrock's Messages endpoint ({self._service}), region {d.region}, model {d.upstream_model}",
            self._credentials_line(),
        ]
