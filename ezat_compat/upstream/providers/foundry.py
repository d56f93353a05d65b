"""Microsoft Foundry with Microsoft Entra ID: the resource's Anthropic API with a bearer token.

- Same API, path and body as ``FoundryProvider`` (Anthropic, "Claude in Microsoft Foundry"),
  with ``Authorization: Bearer <token>`` instead of the resource's key: Anthropic's Foundry page
  and Microsoft's recommend Entra ID for production. The token is for the scope
  ``https://cognitiveservices.azure.com/.default`` (Foundry's resources are Cognitive Services
  accounts; Anthropic's Foundry SDK asks azure-identity's ``get_bearer_token_provider`` for it).
- Credentials: azure-identity (the ``foundry`` extra). With ``tenant_id``, ``client_id`` and
  ``client_secret_env``, a service principal's ``ClientSecretCredential``; else
  ``DefaultAzureCredential``, its chain of the environment (``AZURE_TENANT_ID``,
  ``AZURE_CLIENT_ID``, ``AZURE_CLIENT_SECRET``), workload identity
  (``AZURE_FEDERATED_TOKEN_FILE``), managed identity (``client_id``: a user-assigned one's) and
  the developer tools' sign-ins. ``authority_host`` (else ``AZURE_AUTHORITY_HOST``, else
  ``login.microsoftonline.com``) names a national cloud's authority; a service principal's named
  authority is used as it is, without MSAL's instance discovery (which asks
  ``login.microsoftonline.com`` to vouch for it, as for Azure Stack's own authorities).
- Tokens are cached as Vertex's are: one per deployment and process, taken again under a lock a
  few minutes before it expires (``REFRESH_BEFORE_S``), so a request never waits for a token
  unless the cached one is about to lapse. The token calls leave through the deployment's egress
  (its proxy, CAs and client certificate), as its requests do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from ezat_compat.domain import Deployment
from ezat_compat.errors import UpstreamAuthError
from ezat_compat.upstream.egress import Egress, TLSAdapter
from ezat_compat.upstream.providers import FoundryProvider, ProviderSetupError

try:
    from azure.core.exceptions import AzureError
    from azure.core.pipeline.transport import RequestsTransport
    from azure.identity import ClientSecretCredential, DefaultAzureCredential
except ImportError:  # pragma: no cover - the extra is installed in tests
    RequestsTransport = None

log = logging.getLogger("ezat_compat")

SCOPE = "https://cognitiveservices.azure.com/.default"
REFRESH_BEFORE_S = 300.0  # a cached token is taken again this long before it expires


class FoundryEntraProvider(FoundryProvider):
    """A Foundry deployment with ``auth = "entra_id"`` (module docstring)."""

    __slots__ = ("_clock", "_credential", "_egress", "_expires", "_lock", "_token")
    rewrites = True  # ``authorize`` puts the bearer on each request

    def __init__(
        self, deployment: Deployment, egress: Egress | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        if RequestsTransport is None:
            raise ProviderSetupError(
                f"deployment {deployment.name}: auth 'entra_id' needs azure-identity: "
                "pip install 'ezat-compat[foundry]'"
            )
        super().__init__(deployment)
        self._egress = egress
        self._clock = clock
        self._lock = threading.Lock()
        self._credential: Any = None
        self._token = ""
        self._expires = 0.0

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = super().headers(extra, accept)
        del headers["x-api-key"]  # the bearer is the credential (``authorize``)
        return headers

    def token_session(self) -> requests.Session:
        """The Session azure-identity gets its tokens with: the deployment's egress (its
        ``proxy``: ``""`` none, unset the environment's; the CA bundle, extra CA files and client
        certificate in one TLS context), as Vertex's ``token_session``."""
        session = requests.Session()
        egress = self._egress
        if egress is None:
            return session
        if self.deployment.proxy is not None:
            session.trust_env = False
            session.proxies = dict(egress.proxies)
        session.mount("https://", TLSAdapter(egress.ssl_context(), pool_maxsize=2))
        return session

    def credential(self) -> Any:
        """The azure-identity credential, made once (module docstring)."""
        if self._credential is None:
            with self._lock:
                if self._credential is None:
                    self._credential = self._new_credential()
        return self._credential

    def _new_credential(self) -> Any:
        d = self.deployment
        options: dict[str, Any] = {"transport": RequestsTransport(session=self.token_session(), session_owner=False)}
        if d.authority_host:
            options["authority"] = d.authority_host
        try:
            if d.client_secret_env:
                if not d.client_secret:
                    raise ProviderSetupError(f"deployment {d.name}: {d.client_secret_env} is not set")
                if d.authority_host:  # named by the operator: taken as it is (no instance discovery)
                    options["disable_instance_discovery"] = True
                return ClientSecretCredential(d.tenant_id, d.client_id, d.client_secret, **options)
            if d.client_id:
                options["managed_identity_client_id"] = d.client_id
            if d.tenant_id:
                options["additionally_allowed_tenants"] = [d.tenant_id]
            return DefaultAzureCredential(**options)
        except (ValueError, AzureError) as exc:
            raise ProviderSetupError(f"deployment {d.name}: {_first_line(exc)}") from None

    def token(self) -> str:
        """A bearer token valid for a while yet: the cached one, else a new one (one caller at a
        time asks azure-identity; the others wait for it and use it)."""
        if self._token and self._clock() < self._expires - REFRESH_BEFORE_S:
            return self._token
        credential = self.credential()
        with self._lock:
            if not self._token or self._clock() >= self._expires - REFRESH_BEFORE_S:
                access = credential.get_token(SCOPE)
                self._token, self._expires = access.token, float(access.expires_on)
            return self._token

    def authorize(self, request: requests.PreparedRequest) -> None:
        try:
            token = self.token()
        except ProviderSetupError as exc:
            log.error("%s", exc)
            raise UpstreamAuthError(f"no Entra ID credentials for {self.deployment.name}") from None
        except Exception as exc:  # azure-identity's: no identity found, a refused secret, the authority down
            log.error("deployment %s: no Entra ID token: %s", self.deployment.name, _first_line(exc))
            raise UpstreamAuthError(f"the Entra ID token of {self.deployment.name} could not be had") from None
        request.headers["Authorization"] = f"Bearer {token}"

    def describe(self) -> list[str]:
        d = self.deployment
        if d.client_secret_env:
            kind = f"service principal {d.client_id} of tenant {d.tenant_id}, secret from {d.client_secret_env}"
            kind += "" if d.client_secret else " (not set)"
        else:
            kind = "azure-identity's DefaultAzureCredential chain"
        self.credential()
        return [
            f"provider: foundry (hosted on {d.hosting}), model {d.upstream_model}",
            f"credentials: Microsoft Entra ID, {kind}",
        ]


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (azure-identity's run over several), or its type."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
