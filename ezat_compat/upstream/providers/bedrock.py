"""Amazon Bedrock: InvokeModel and InvokeModelWithResponseStream, signed with SigV4.

- ``POST /model/{modelId}/invoke`` and ``/model/{modelId}/invoke-with-response-stream`` on
  ``https://bedrock-runtime.{region}.amazonaws.com`` (botocore's service model,
  ``botocore/data/bedrock-runtime/2023-09-30/service-2.json``: ``InvokeModel``,
  ``InvokeModelWithResponseStream``). The model id (or inference-profile id or ARN) is one path
  segment, percent-encoded as botocore encodes it.
- The body is Anthropic's Messages body without ``model`` and ``stream``, with
  ``"anthropic_version": "bedrock-2023-05-31"`` and the betas as ``"anthropic_beta": [...]``
  (Amazon Bedrock user guide, "Anthropic Claude Messages API"; Anthropic, "Claude on Amazon
  Bedrock"). The betas Bedrock refuses are dropped (``betas.py``).
- Credentials: botocore's standard chain (environment, the shared files' profile
  ``aws_profile``, SSO, container and instance roles), refreshed by botocore; each request is
  signed with ``SigV4Auth(credentials, "bedrock", region)``. With ``api_key_env`` set, a Bedrock
  API key is sent as ``Authorization: Bearer`` instead (Bedrock user guide, "API keys").
  botocore's own calls for them (STS AssumeRole and AssumeRoleWithWebIdentity, SSO) leave
  through the deployment's egress, as its requests do: its ``proxy``, its CA files and its
  client certificate, set with botocore's public session settings (``credentials_session``).
- The stream is AWS event-stream framing (``application/vnd.amazon.eventstream``), decoded
  with botocore's ``EventStreamBuffer``: each ``chunk`` event's payload is
  ``{"bytes": "<base64>"}`` whose bytes are one Anthropic stream event's JSON (the service
  model's ``ResponseStream`` / ``PayloadPart``); exception events become Anthropic ``error``
  events, so the rest of the pipeline sees the events it sees from Anthropic.
- Errors are ``{"message": …}`` with the type in ``x-amzn-ErrorType``; ``BEDROCK_ERRORS``
  maps them onto Anthropic's envelope (and so onto our failover and error table).

Token counting (``/v1/messages/count_tokens``) is Bedrock's CountTokens, ``POST
/model/{modelId}/count-tokens`` with ``{"input": {"invokeModel": {"body": <base64 of the
InvokeModel body>}}}``, answering ``{"inputTokens": N}`` (Amazon Bedrock API reference,
"CountTokens", "InvokeModelTokensRequest"). It takes a foundation model's own id: an
inference-profile id (``us.anthropic.…``) is refused with "The provided model doesn't support
counting tokens", so its geography prefix is dropped for the count (the same model, the same
tokenizer). InvokeModel's body wants ``max_tokens``; a count has none, so 1 is put in.

Anthropic's Messages API itself is also offered on Bedrock (``/anthropic/v1/messages`` on
bedrock-runtime and bedrock-mantle; Bedrock user guide, "Inference using Anthropic Messages
API"), but not for every model and region; InvokeModel is offered for every Claude model on
Bedrock, so it is what this provider calls.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import requests

from ezat_compat.domain import Deployment
from ezat_compat.endpoints import COUNT_TOKENS, MESSAGES
from ezat_compat.errors import UpstreamAuthError, UpstreamStatusError
from ezat_compat.translate.cache_marks import without_ttl
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.egress import Egress, missing_file
from ezat_compat.upstream.providers import Event, Provider, ProviderSetupError, beta_list, common_headers
from ezat_compat.upstream.providers.betas import takes_cache_ttl, takes_output_format, told_format
from ezat_compat.upstream.providers.features import drop_gated_fields
from ezat_compat.upstream.sse import pulled

try:
    import botocore.config
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.eventstream import EventStreamBuffer, EventStreamMessage
    from botocore.exceptions import BotoCoreError
except ImportError:  # pragma: no cover - the extra is installed in tests
    botocore = None

log = logging.getLogger("ezat_compat")

ANTHROPIC_VERSION = "bedrock-2023-05-31"
SERVICE = "bedrock"
_SIGNED_HEADERS = ("content-type", "accept")  # besides host and x-amz-date, which botocore adds,
# and the invocation's options (``invoke_options``), signed as botocore signs them

# x-amzn-ErrorType (and an event stream's :exception-type) -> (status, Anthropic error type).
# InvokeModel's errors (Bedrock API reference, "InvokeModel", Errors) and the common ones
# (signature, unknown key, expired token), keyed in lower case: event streams spell them
# lowerCamelCase (throttlingException), headers UpperCamelCase.
BEDROCK_ERRORS: Mapping[str, tuple[int, str]] = {
    "throttlingexception": (429, "rate_limit_error"),
    "servicequotaexceededexception": (429, "rate_limit_error"),
    "servicesunavailableexception": (503, "overloaded_error"),
    "serviceunavailableexception": (503, "overloaded_error"),
    "modelnotreadyexception": (503, "overloaded_error"),
    "internalserverexception": (500, "api_error"),
    "modelstreamerrorexception": (500, "api_error"),
    "modelerrorexception": (500, "api_error"),
    "modeltimeoutexception": (504, "timeout_error"),
    "validationexception": (400, "invalid_request_error"),
    "accessdeniedexception": (403, "permission_error"),
    "unrecognizedclientexception": (403, "permission_error"),
    "invalidsignatureexception": (403, "permission_error"),
    "expiredtokenexception": (403, "permission_error"),
    "resourcenotfoundexception": (404, "not_found_error"),
}


def error_of(kind: str, status: int) -> tuple[int, str]:
    """(status, Anthropic error type) for a Bedrock error type (``ThrottlingException:http://…``
    or ``throttlingException``); unknown types keep the status."""
    name = kind.split(":", 1)[0].strip().lower()
    known = BEDROCK_ERRORS.get(name)
    if known is not None:
        return known
    return status, "invalid_request_error" if status < 500 else "api_error"


# The geography prefixes of Bedrock's cross-region inference profiles ("us.anthropic.…").
PROFILE_PREFIXES = ("us.", "eu.", "apac.", "jp.", "au.", "ca.", "us-gov.", "global.")


def counting_model(upstream_model: str) -> str:
    """The model id CountTokens takes for ``upstream_model``: an inference profile's foundation
    model (its geography prefix dropped); any other id (a foundation model, an ARN) as it is."""
    for prefix in PROFILE_PREFIXES:
        if upstream_model.startswith(prefix) and upstream_model[len(prefix) :].startswith("anthropic."):
            return upstream_model[len(prefix) :]
    return upstream_model


def invoke_options(deployment: Deployment) -> dict[str, str]:
    """The header fields of InvokeModel's options a deployment sets (botocore's bedrock-runtime
    service model: ``guardrailIdentifier``, ``guardrailVersion`` and ``serviceTier`` travel as
    ``X-Amzn-Bedrock-GuardrailIdentifier``, ``-GuardrailVersion`` and ``-Service-Tier``), in
    lower case, as ``headers`` sends them and ``authorize`` signs them."""
    options = {}
    if deployment.guardrail:
        options["x-amzn-bedrock-guardrailidentifier"] = deployment.guardrail
        options["x-amzn-bedrock-guardrailversion"] = deployment.guardrail_version
    if deployment.service_tier:
        options["x-amzn-bedrock-service-tier"] = deployment.service_tier
    return options


def envelope(error_type: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()


class BedrockProvider(Provider):
    """A Bedrock deployment (module docstring)."""

    __slots__ = (
        "_ca_file",
        "_count_path",
        "_credentials",
        "_egress",
        "_lock",
        "_no_ttl",
        "_options",
        "_paths",
        "_session",
        "_told_format",
    )
    name = "bedrock"
    rewrites = True

    def __init__(self, deployment: Deployment, egress: Egress | None = None) -> None:
        if botocore is None:
            raise ProviderSetupError(
                f"deployment {deployment.name}: provider 'bedrock' needs botocore: pip install 'ezat-compat[bedrock]'"
            )
        super().__init__(deployment)
        model = quote(deployment.upstream_model, safe="")
        self._paths = (f"/model/{model}/invoke", f"/model/{model}/invoke-with-response-stream")
        self._count_path = f"/model/{quote(counting_model(deployment.upstream_model), safe='')}/count-tokens"
        self._lock = threading.Lock()
        self._session: Any = None
        self._credentials: Any = None
        self._egress = egress
        self._ca_file = ""  # the combined CA file of the credential calls, once written
        self._options = invoke_options(deployment)
        self._no_ttl = not takes_cache_ttl(self.name, deployment.upstream_model)
        self._told_format = not takes_output_format(self.name, deployment.upstream_model)
        logging.getLogger("botocore.auth").setLevel(logging.INFO)  # its debug lines hold the signature

    # -- the request ----------------------------------------------------------------------------

    def shape(
        self,
        body: bytes,
        source: Mapping[str, Any] | None,
        stream: bool | None,
        headers: Mapping[str, str] | None,
        path: str = MESSAGES,
    ) -> tuple[bytes, Mapping[str, str] | None]:
        data = dict(source) if source is not None else json.loads(body)
        data.pop("model", None)
        data.pop("stream", None)
        out: dict[str, Any] = {"anthropic_version": ANTHROPIC_VERSION}
        betas = beta_list(self.name, headers)
        if betas:
            out["anthropic_beta"] = betas
        out.update((k, v) for k, v in data.items() if k not in ("anthropic_version", "anthropic_beta"))
        out = drop_gated_fields(out, betas)  # a field whose beta Bedrock doesn't take goes with it
        if self._told_format:
            out = told_format(out)  # the model's copy of the schema on Bedrock refuses the field
        if self._no_ttl:  # an older model: its cache marks go with the default five minutes
            for key in ("system", "tools", "messages"):
                if key in out:
                    out[key] = without_ttl(out[key])
        if path == COUNT_TOKENS:  # CountTokens: the InvokeModel body it would count, as base64
            out.setdefault("max_tokens", 1)
            invoke = base64.b64encode(encode_body(out)).decode()
            return encode_body({"input": {"invokeModel": {"body": invoke}}}), None
        return encode_body(out), None  # betas and the version travel in the body

    def path(self, path: str, stream: bool) -> str:
        if path == COUNT_TOKENS and not stream:
            return self._count_path
        if path != MESSAGES:
            raise UpstreamAuthError(f"{self.deployment.name} (bedrock) does not offer {path}")
        return self._paths[stream]

    def answer(self, path: str, data: bytes) -> bytes:
        """CountTokens' ``{"inputTokens": N}`` as Anthropic's ``{"input_tokens": N}``."""
        if path != COUNT_TOKENS:
            return data
        try:
            counted = json.loads(data)["inputTokens"]
        except (ValueError, KeyError, TypeError):
            return data  # not what CountTokens answers: the caller sees it as it came
        return encode_body({"input_tokens": counted})

    def headers(self, extra: Mapping[str, str] | None, accept: str) -> dict[str, str]:
        accept = "application/vnd.amazon.eventstream" if accept == "text/event-stream" else accept
        headers = common_headers(accept)
        if self.deployment.api_key:
            headers["authorization"] = f"Bearer {self.deployment.api_key}"
        headers.update(self._options)
        return headers

    def credentials_session(self) -> Any:
        """The botocore session the credentials are found and refreshed with. With an egress,
        every client botocore makes for them (``create_nested_client``: STS, SSO) gets it
        through the session's public settings: a default client ``Config`` with ``proxies``
        (only when the deployment sets ``proxy``: ``{}`` for ``""`` is direct; unset, botocore
        reads the environment per URL, as requests does) and ``client_cert``; the
        ``ca_bundle`` variable naming one file, the bundle followed by the extra CA files
        (``_ca_bundle``). Egress None: botocore's own reading of the environment.
        ``ProviderSetupError`` when a file it names can't be read."""
        session = botocore.session.Session(profile=self.deployment.aws_profile or None)
        egress = self._egress
        if egress is None:
            return session
        problem = missing_file(egress)
        if problem is not None:
            raise ProviderSetupError(f"deployment {self.deployment.name}: {problem}")
        options: dict[str, Any] = {}
        if self.deployment.proxy is not None:
            options["proxies"] = dict(egress.proxies)
        if egress.client_cert:
            options["client_cert"] = (
                (egress.client_cert, egress.client_key) if egress.client_key else egress.client_cert
            )
        if options:
            session.set_default_client_config(botocore.config.Config(**options))
        bundle = self._ca_bundle(session.get_config_variable("ca_bundle"), egress)
        if bundle:
            session.set_config_variable("ca_bundle", bundle)
        return session

    def _ca_bundle(self, configured: str | None, egress: Egress) -> str:
        """The one CA file botocore's ``ca_bundle`` names for the credential calls ("": keep
        ``configured``, botocore's own ``AWS_CA_BUNDLE`` or the profile's ``ca_bundle``). With
        extra CA files: a private copy (0600, removed at exit) of the bundle (``configured``,
        else the egress's: ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` or certifi's) followed by
        them, read now."""
        if not egress.extra_ca_files:
            return "" if configured else egress.ca_bundle
        parts = []
        named = [("CA bundle", configured or egress.ca_bundle)] + [("ca_file", p) for p in egress.extra_ca_files]
        for what, path in named:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise ProviderSetupError(
                    f"deployment {self.deployment.name}: {what} {path}: {exc.strerror or exc}"
                ) from None
            parts.append(data if data.endswith(b"\n") else data + b"\n")
        try:
            if not self._ca_file:  # one per provider, written again if the credentials are made again
                fd, self._ca_file = tempfile.mkstemp(prefix="ezat-aws-ca-", suffix=".pem")  # mode 0600
                os.close(fd)
                atexit.register(_remove, self._ca_file, os.getpid())
            with open(self._ca_file, "wb") as f:
                f.write(b"".join(parts))
        except OSError as exc:
            raise ProviderSetupError(f"deployment {self.deployment.name}: the combined CA file: {exc}") from None
        return self._ca_file

    def credentials(self) -> Any:
        """botocore's credentials (refreshable ones refresh themselves); made once, on first use."""
        if self._credentials is None:
            with self._lock:
                if self._credentials is None:
                    try:
                        session = self.credentials_session()
                        credentials = session.get_credentials()
                    except BotoCoreError as exc:
                        raise ProviderSetupError(f"deployment {self.deployment.name}: {exc}") from None
                    if credentials is None:
                        raise ProviderSetupError(
                            f"deployment {self.deployment.name}: botocore found no AWS credentials "
                            "(environment, shared files"
                            + (f" profile {self.deployment.aws_profile!r}" if self.deployment.aws_profile else "")
                            + ", SSO, container or instance role)"
                        )
                    self._session, self._credentials = session, credentials
        return self._credentials

    def authorize(self, request: requests.PreparedRequest) -> None:
        if self.deployment.api_key:
            return  # a Bedrock API key, already in the header fields
        try:
            frozen = self.credentials().get_frozen_credentials()
        except ProviderSetupError as exc:
            log.error("%s", exc)
            raise UpstreamAuthError(f"no AWS credentials for {self.deployment.name}") from None
        except Exception as exc:  # a refresh that failed (an expired SSO session, the role's endpoint)
            log.error(
                "deployment %s: AWS credentials could not be refreshed: %s", self.deployment.name, type(exc).__name__
            )
            raise UpstreamAuthError(f"the AWS credentials of {self.deployment.name} could not be refreshed") from None
        signed = {
            k: v for k, v in request.headers.items() if k.lower() in _SIGNED_HEADERS or k.lower() in self._options
        }
        aws = AWSRequest(method="POST", url=request.url, data=request.body, headers=signed)
        SigV4Auth(frozen, SERVICE, self.deployment.region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            value = aws.headers.get(name)
            if value is not None:
                request.headers[name] = value

    # -- the answer -----------------------------------------------------------------------------

    @staticmethod
    def decode(chunks: Iterable[bytes], *, before_read: Callable[[], None] | None = None) -> Iterator[Event]:
        return iter_event_stream(chunks, before_read=before_read)

    @staticmethod
    def decoder() -> EventStreamDecoder:
        return EventStreamDecoder()

    def status_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
        kind = _header(headers, "x-amzn-errortype")
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):  # already Anthropic's
            return UpstreamStatusError(status, body, headers)
        message = ""
        if isinstance(data, dict):
            message = str(data.get("message") or data.get("Message") or "")
        if not kind and not message:  # not Bedrock's answer: something in between
            return UpstreamStatusError(status, body, headers)
        mapped_status, error_type = error_of(kind, status)
        return UpstreamStatusError(mapped_status, envelope(error_type, message or kind), headers)

    def describe(self) -> list[str]:
        d = self.deployment
        lines = [f"provider: bedrock, region {d.region}, model {d.upstream_model}"]
        if d.guardrail:
            lines.append(f"guardrail {d.guardrail} version {d.guardrail_version}")
        if d.service_tier:
            lines.append(f"service tier {d.service_tier}")
        if d.api_key_env:
            lines.append(f"credentials: Bedrock API key from {d.api_key_env}" + ("" if d.api_key else " (not set)"))
            return lines
        credentials = self.credentials()
        method = getattr(credentials, "method", "") or "unknown"
        profile = f" (profile {d.aws_profile})" if d.aws_profile else ""
        via = "; its STS and SSO calls use this egress" if self._egress is not None else ""
        lines.append(f"credentials: AWS SigV4, found by botocore's chain in {method}{profile}{via}")
        return lines


def _remove(path: str, owner: int) -> None:
    """Remove the combined CA file at exit, in the process that wrote it only (a forked
    worker's exit must not take it from the others)."""
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), "")
    return value


class EventStreamDecoder:
    """A Bedrock event stream's Anthropic events, fed as the body arrives (``StreamDecoder``):
    botocore's ``EventStreamBuffer`` takes the bytes and gives the messages they complete. A
    message the body's end cut off is not one; a bad CRC or an oversized message raises
    (botocore's ``ParserError``: the stream is broken), after the events before it."""

    __slots__ = ("_buffer", "_error")

    def __init__(self) -> None:
        self._buffer = EventStreamBuffer()
        self._error: BaseException | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        error = self._error
        if error is not None:
            self._error = None
            raise error
        self._buffer.add_data(chunk)
        out: list[Event] = []
        try:
            for message in self._buffer:
                event = _event(message)
                if event is not None:
                    out.append(event)
        except Exception as exc:
            if not out:
                raise
            exc.__traceback__ = None  # kept: not with this frame, which holds the decoder
            self._error = exc
        return out

    def end(self) -> list[Event]:
        error, self._error = self._error, None
        if error is not None:
            raise error
        return []  # what botocore still holds is a message the body's end cut off


def iter_event_stream(chunks: Iterable[bytes], *, before_read: Callable[[], None] | None = None) -> Iterator[Event]:
    """(event type, data) of each Anthropic event of a Bedrock event stream, as ``iter_sse``
    gives them for Anthropic's SSE (``EventStreamDecoder``, pulled). ``before_read`` is called
    before each further chunk is read (every complete message of the chunks so far has been
    yielded by then)."""
    return pulled(EventStreamDecoder(), chunks, before_read)


def _event(message: EventStreamMessage) -> Event | None:
    headers = message.headers
    kind = headers.get(":message-type")
    if kind == "event":
        if headers.get(":event-type") != "chunk":
            return None  # an event type this API doesn't document: skipped
        return _chunk(message.payload)
    if kind == "exception":
        name = str(headers.get(":exception-type", ""))
    else:  # "error": :error-code and :error-message
        name = str(headers.get(":error-code", ""))
    try:
        text = json.loads(message.payload).get("message", "") if message.payload else ""
    except (ValueError, AttributeError):
        text = ""
    text = text or str(headers.get(":error-message", "")) or name
    _, error_type = error_of(name, 500)
    return "error", json.dumps({"type": "error", "error": {"type": error_type, "message": text}})


def _chunk(payload: bytes) -> Event:
    from ezat_compat.errors import UpstreamStreamError

    try:
        data = base64.b64decode(json.loads(payload)["bytes"], validate=True).decode("utf-8")
        event_type = json.loads(data)["type"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise UpstreamStreamError("Bedrock sent a stream chunk that is not an Anthropic event") from None
    return str(event_type), data
