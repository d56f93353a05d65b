"""Providers: how one deployment is called, chosen once per deployment and process.

Every deployment speaks Anthropic's Messages API; what differs per provider is data and a few
small steps, all on one object (``Provider``) that the upstream client keeps on the
deployment's route:

    shape(body, source, stream, headers, path)
                                          the body and header fields this provider takes
                                          (model in the URL or the body, anthropic_version,
                                          betas in a header or the body, the betas it refuses)
    path(path, stream)                    the URL path (InvokeModel, rawPredict, /v1/messages)
    headers(extra, accept)                the header fields (x-api-key, or none: see authorize)
    authorize(request)                    a SigV4 signature or a bearer token, on the final request
    decoder()                             the stream's framing: a ``StreamDecoder`` fed the
                                          body's bytes as they come -> (event type, data) pairs
    decode(chunks, before_read)           the same, pulled from an iterable of chunks
    status_error(status, body, headers)   the provider's error answer as Anthropic's envelope
    answer(path, data)                    a JSON answer as Anthropic's API gives it (Bedrock's
                                          CountTokens names its count otherwise)

``Provider`` itself is Anthropic's own API (and Foundry's, which serves the same API under the
resource's ``/anthropic`` path with the same ``x-api-key``): ``rewrites`` is False, so the
client's hot path skips ``path`` and ``authorize`` altogether and the request costs what it
cost before providers existed. ``bedrock.py``, ``aws_messages.py`` (Claude Platform on AWS and
Bedrock's Messages endpoint: Anthropic's API, SigV4-signed through ``aws.py``) and ``vertex.py``
import their SDK (an extra) only when a deployment of theirs is made; a missing extra is named
in ``ProviderSetupError``.

Betas and fields each provider refuses are data in ``betas.py``, the tools and beta-gated fields
in ``features.py``, each rule with its source.

Each deployment speaks its configured ``anthropic-version`` (``Deployment.anthropic_version``),
never the client's: ``shape`` makes the body one that version takes (``translate/versions.py``:
sampling fields dropped under 2026-10-21), on each attempt of a failover, and ``headers`` sends
the deployment's version whatever the client sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import requests

from ezat_compat import __version__
from ezat_compat.domain import Deployment
from ezat_compat.endpoints import MESSAGES
from ezat_compat.errors import UpstreamStatusError
from ezat_compat.translate.versions import shape_for_version, strict
from ezat_compat.upstream.bodies import encode_body, with_model
from ezat_compat.upstream.egress import Egress
from ezat_compat.upstream.providers.betas import allowed_betas
from ezat_compat.upstream.sse import SSEDecoder, StreamDecoder, iter_sse

Event = tuple[str, str]
USER_AGENT = f"ezat-compat/{__version__}"
Decoder = Callable[..., Iterator[Event]]  # (chunks, *, before_read=None) -> events
NewDecoder = Callable[[], StreamDecoder]  # a stream's decoder, fed its bytes as they come


def common_headers(accept: str) -> dict[str, str]:
    """The header fields every provider sends (its own authentication and version added)."""
    return {
        "content-type": "application/json",
        "accept": accept,
        "user-agent": USER_AGENT,
        "accept-encoding": "identity",
    }


class ProviderSetupError(Exception):
    """A deployment's provider can't be used as configured (its extra isn't installed, no
    credentials were found); the message is one line naming the deployment, never a secret."""


class Provider:
    """Anthropic's Messages API (``provider = "anthropic"``, and Foundry's): the body with
    ``model`` in front, ``x-api-key`` and ``anthropic-version`` header fields, SSE."""

    __slots__ = ("deployment", "model", "strict")
    name = "anthropic"
    rewrites = False  # True: ``path`` and ``authorize`` run for each call
    decode: Decoder = staticmethod(iter_sse)
    decoder: NewDecoder = SSEDecoder

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.model = deployment.upstream_model
        self.strict = strict(deployment.anthropic_version)  # its version refuses some fields

    def versioned(self, source: Mapping[str, Any]) -> Mapping[str, Any]:
        """``source`` as the deployment's API version takes it (``shape_for_version``)."""
        return shape_for_version(source, self.deployment.anthropic_version) if self.strict else source

    def _shaped(self, body: bytes, source: Mapping[str, Any] | None) -> bytes:
        """``body`` (serialized ``source``), again from the shaped ``source`` when its version
        leaves something out; the same bytes otherwise (the hot path: no encoding)."""
        if not self.strict or source is None:
            return body
        shaped = self.versioned(source)
        return body if shaped is source else encode_body(shaped)

    def shape(
        self,
        body: bytes,
        source: Mapping[str, Any] | None,
        stream: bool | None,
        headers: Mapping[str, str] | None,
        path: str = MESSAGES,
    ) -> tuple[bytes, Mapping[str, str] | None]:
        """The body to send to ``path`` (``body`` serialized without ``model``; ``source`` the
        same as data, when the caller has it) and the header fields forwarded with it."""
        return with_model(self._shaped(body, source), self.model, stream=stream), headers

    def answer(self, path: str, data: bytes) -> bytes:
        """A JSON answer of ``path`` as Anthropic's API words it (the clouds': ``rewrites``)."""
        return data

    def path(self, path: str, stream: bool) -> str:
        return path

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = common_headers(accept)
        headers["x-api-key"] = self.deployment.api_key
        if extra:
            headers.update(extra)
        headers["anthropic-version"] = self.deployment.anthropic_version  # never the client's
        return headers

    def authorize(self, request: requests.PreparedRequest) -> None:
        """Sign or authenticate the prepared request (clouds); ``UpstreamAuthError`` when the
        credentials can't be had."""

    def status_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
        return UpstreamStatusError(status, body, headers)

    def describe(self) -> list[str]:
        """check-config's words for this deployment (no secret); ``ProviderSetupError`` when it
        can't be used."""
        d = self.deployment
        return [f"provider: {self.name}", f"key: from {d.api_key_env}" + ("" if d.api_key else " (not set)")]


class FoundryProvider(Provider):
    """Claude in Microsoft Foundry: Anthropic's Messages API at
    ``https://{resource}.services.ai.azure.com/anthropic/v1/messages`` with the resource's key
    in ``x-api-key`` and ``anthropic-version: 2023-06-01`` (Anthropic, "Claude in Microsoft
    Foundry"; Microsoft's sample microsoft/Generative-AI-for-beginners-dotnet,
    BasicChat-11FoundryClaude: "x-api-key header (not Authorization: Bearer)"). Betas pass
    through filtered by ``betas.py``'s Foundry row. With ``auth = "entra_id"``: ``foundry.py``.
    What "Hosted on Azure" refuses is ``features.py``'s."""

    __slots__ = ()
    name = "foundry"

    def shape(
        self,
        body: bytes,
        source: Mapping[str, Any] | None,
        stream: bool | None,
        headers: Mapping[str, str] | None,
        path: str = MESSAGES,
    ) -> tuple[bytes, Mapping[str, str] | None]:
        return with_model(self._shaped(body, source), self.model, stream=stream), _filtered_beta_header(
            self.name, headers
        )

    def describe(self) -> list[str]:
        d = self.deployment
        key = f"key: from {d.api_key_env}" + ("" if d.api_key else " (not set)")
        return [f"provider: foundry, hosted on {'Azure' if d.hosting == 'azure' else 'Anthropic'}", key]


def _filtered_beta_header(provider: str, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` with the ``anthropic-beta`` values ``provider`` refuses taken out."""
    if not headers or "anthropic-beta" not in headers:
        return headers
    out = {k: v for k, v in headers.items() if k != "anthropic-beta"}
    betas = allowed_betas(provider, headers["anthropic-beta"])
    if betas:
        out["anthropic-beta"] = ",".join(betas)
    return out


def beta_list(provider: str, headers: Mapping[str, str] | None) -> list[str]:
    """The ``anthropic-beta`` values of ``headers`` that ``provider`` accepts."""
    if not headers or "anthropic-beta" not in headers:
        return []
    return allowed_betas(provider, headers["anthropic-beta"])


def make_provider(deployment: Deployment, egress: Egress | None = None) -> Provider:
    """The deployment's provider object (its SDK imported now); ``ProviderSetupError`` when its
    extra is missing. ``egress``: the deployment's proxies, CAs and client certificate, which a
    provider's own calls (Vertex's token refresh, Bedrock's STS and SSO credential calls,
    Foundry's Entra ID tokens) go through too (None: the environment's)."""
    if deployment.provider == "bedrock":
        from ezat_compat.upstream.providers.bedrock import BedrockProvider

        return BedrockProvider(deployment, egress)
    if deployment.provider == "claude_platform_aws":
        from ezat_compat.upstream.providers.aws_messages import ClaudePlatformAwsProvider

        return ClaudePlatformAwsProvider(deployment, egress)
    if deployment.provider == "bedrock_messages":
        from ezat_compat.upstream.providers.aws_messages import BedrockMessagesProvider

        return BedrockMessagesProvider(deployment, egress)
    if deployment.provider == "vertex":
        from ezat_compat.upstream.providers.vertex import VertexProvider

        return VertexProvider(deployment, egress)
    if deployment.provider == "foundry" and deployment.auth == "entra_id":
        from ezat_compat.upstream.providers.foundry import FoundryEntraProvider

        return FoundryEntraProvider(deployment, egress)
    if deployment.provider == "foundry":
        return FoundryProvider(deployment)
    return Provider(deployment)


def events_of(decode: Decoder, chunks: Iterable[bytes], before_read: Callable[[], None] | None) -> Iterator[Event]:
    """``decode``'s events of ``chunks`` (a seam for tests that feed bytes split anywhere)."""
    return decode(chunks, before_read=before_read)
