"""Google Vertex AI: Claude's ``rawPredict`` and ``streamRawPredict``, with Google's credentials.

- ``POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict``
  and ``…:streamRawPredict`` on ``https://{region}-aiplatform.googleapis.com`` (Anthropic,
  "Claude on Vertex AI"; Google Cloud, "Use Claude models").
- The body is Anthropic's without ``model`` (it is in the URL), with
  ``"anthropic_version": "vertex-2023-10-16"`` in the body rather than the header (same
  sources); a stream keeps ``"stream": true``. Betas go in the ``anthropic-beta`` header, those
  Vertex refuses dropped (``betas.py``).
- Credentials: Google's application default credentials (``google.auth.default`` with the
  cloud-platform scope: ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's file, the metadata
  server), refreshed by google-auth with its requests transport when they expire; sent as
  ``Authorization: Bearer``.
- The stream is SSE, as Anthropic's. Errors are Google's JSON (``{"error": {"code": 429,
  "status": "RESOURCE_EXHAUSTED", "message": …}}``) or Anthropic's envelope passed through;
  ``GOOGLE_STATUS`` maps Google's onto Anthropic's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests

from ezat_compat.domain import Deployment
from ezat_compat.endpoints import COUNT_TOKENS, MESSAGES
from ezat_compat.errors import UpstreamAuthError, UpstreamStatusError
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.egress import Egress, TLSAdapter
from ezat_compat.upstream.providers import Provider, ProviderSetupError, beta_list, common_headers
from ezat_compat.upstream.providers.features import drop_gated_fields

try:
    import google.auth
    import google.auth.exceptions
    import google.auth.transport.requests
except ImportError:  # pragma: no cover - the extra is installed in tests
    google = None  # type: ignore[assignment]

log = logging.getLogger("ezat_compat")

ANTHROPIC_VERSION = "vertex-2023-10-16"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

# Google's canonical error codes (google.rpc.Code, "status" in Google's JSON errors) ->
# (status, Anthropic error type). 429 RESOURCE_EXHAUSTED is Vertex's quota answer (Google
# Cloud, "Quotas and limits" for partner models: "429 Resource exhausted").
GOOGLE_STATUS: Mapping[str, tuple[int, str]] = {
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "overloaded_error"),
    "INTERNAL": (500, "api_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
}


RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def retry_delay(details: Any) -> float | None:
    """The delay a Google error's ``google.rpc.RetryInfo`` detail asks for, in seconds (Google's
    error model, AIP-193: ``{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay":
    "30s"}``, a protobuf Duration in its JSON form); None without one. Vertex answers a quota 429
    with no ``retry-after`` header (anthropics/claude-code#1378 shows its headers), so this is
    the only hint it can give."""
    for detail in details if isinstance(details, list) else []:
        if not isinstance(detail, dict) or detail.get("@type") != RETRY_INFO:
            continue
        value = detail.get("retryDelay")
        if isinstance(value, str) and value.endswith("s"):
            try:
                seconds = float(value[:-1])
            except ValueError:
                return None
            return seconds if seconds >= 0 else None
    return None


class VertexProvider(Provider):
    """A Vertex AI deployment (module docstring)."""

    __slots__ = ("_count_path", "_credentials", "_egress", "_lock", "_paths", "_transport")
    name = "vertex"
    rewrites = True

    def __init__(self, deployment: Deployment, egress: Egress | None = None) -> None:
        if google is None:
            raise ProviderSetupError(
                f"deployment {deployment.name}: provider 'vertex' needs google-auth: pip install 'ezat-compat[vertex]'"
            )
        super().__init__(deployment)
        base = (
            f"/v1/projects/{quote(deployment.project, safe='')}/locations/{quote(deployment.region, safe='')}"
            f"/publishers/anthropic/models/{quote(deployment.upstream_model, safe='@')}"
        )
        self._paths = (base + ":rawPredict", base + ":streamRawPredict")
        self._count_path = base.rpartition("/")[0] + "/count-tokens:rawPredict"  # the model goes in the body
        self._lock = threading.Lock()
        self._credentials: Any = None
        self._transport: Any = None
        self._egress = egress

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
        if path == COUNT_TOKENS:  # count-tokens:rawPredict names the model in the body
            data.pop("stream", None)
            data = {"model": self.deployment.upstream_model, **data}
        elif stream is not None:
            data["stream"] = stream
        out = {"anthropic_version": ANTHROPIC_VERSION, **{k: v for k, v in data.items() if k != "anthropic_version"}}
        betas = beta_list(self.name, headers)
        out = drop_gated_fields(out, betas)  # a field whose beta Vertex doesn't take goes with it
        return encode_body(out), ({"anthropic-beta": ",".join(betas)} if betas else None)

    def path(self, path: str, stream: bool) -> str:
        if path == COUNT_TOKENS and not stream:
            return self._count_path
        if path != MESSAGES:
            raise UpstreamAuthError(f"{self.deployment.name} (vertex) does not offer {path}")
        return self._paths[stream]

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        headers = common_headers(accept)
        if extra:
            headers.update(extra)
        return headers

    def token_session(self) -> requests.Session:
        """The Session google-auth refreshes the token with: the deployment's egress, as for its
        calls — its ``proxy`` key (``""``: none; unset: the environment's, per URL), and the CA
        bundle, extra CA files and client certificate in one TLS context (``egress.py``)."""
        session = requests.Session()
        egress = self._egress
        if egress is None:
            return session  # requests' own reading of the environment
        if self.deployment.proxy is not None:  # set: it alone decides, as for the calls
            session.trust_env = False
            session.proxies = dict(egress.proxies)
        session.mount("https://", TLSAdapter(egress.ssl_context(), pool_maxsize=2))
        return session

    def credentials(self) -> Any:
        """The application default credentials, made once (google-auth refreshes them)."""
        if self._credentials is None:
            with self._lock:
                if self._credentials is None:
                    try:
                        credentials, _ = google.auth.default(scopes=list(SCOPES))
                    except google.auth.exceptions.DefaultCredentialsError as exc:
                        first = str(exc).split("\n", 1)[0]
                        raise ProviderSetupError(f"deployment {self.deployment.name}: {first}") from None
                    self._transport = google.auth.transport.requests.Request(session=self.token_session())
                    self._credentials = credentials
        return self._credentials

    def authorize(self, request: requests.PreparedRequest) -> None:
        try:
            credentials = self.credentials()
            if not credentials.valid:
                with self._lock:
                    if not credentials.valid:
                        credentials.refresh(self._transport)
        except ProviderSetupError as exc:
            log.error("%s", exc)
            raise UpstreamAuthError(f"no Google credentials for {self.deployment.name}") from None
        except google.auth.exceptions.GoogleAuthError as exc:
            log.error("deployment %s: Google credentials could not be refreshed: %s", self.deployment.name, exc)
            raise UpstreamAuthError(
                f"the Google credentials of {self.deployment.name} could not be refreshed"
            ) from None
        request.headers["Authorization"] = f"Bearer {credentials.token}"

    def status_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
        try:
            data = json.loads(body)
        except ValueError:
            return UpstreamStatusError(status, body, headers)
        if isinstance(data, list) and data and isinstance(data[0], dict):  # Google's errors may come in a list
            data = data[0]
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict) or isinstance(error.get("type"), str):  # Anthropic's own envelope
            return UpstreamStatusError(status, body, headers)
        mapped_status, error_type = GOOGLE_STATUS.get(str(error.get("status")), (status, "api_error"))
        message = str(error.get("message") or error.get("status") or f"HTTP {status}")
        payload = json.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()
        return UpstreamStatusError(mapped_status, payload, headers, retry_after=retry_delay(error.get("details")))

    def describe(self) -> list[str]:
        d = self.deployment
        credentials = self.credentials()
        email = getattr(credentials, "service_account_email", None)
        kind = f"service account {email}" if email else type(credentials).__name__
        return [
            f"provider: vertex, project {d.project}, region {d.region}, model {d.upstream_model}",
            f"credentials: Google application default credentials ({kind})",
        ]
