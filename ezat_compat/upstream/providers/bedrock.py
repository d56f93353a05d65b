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
- Credentials: botocore's standard chain, its calls through the deployment's egress
  (``aws.py``); each request is signed with ``SigV4Auth(credentials, "bedrock", region)``. With
  ``api_key_env`` set, a Bedrock API key is sent as ``Authorization: Bearer`` instead (Bedrock
  user guide, "API keys").
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
Bedrock, so it is what this provider calls. ``provider = "bedrock_messages"`` calls that
endpoint instead (``aws_messages.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import requests

from ezat_compat.domain import Deployment
from ezat_compat.endpoints import COUNT_TOKENS, MESSAGES
from ezat_compat.errors import UpstreamAuthError, UpstreamStatusError
from ezat_compat.translate.cache_marks import without_ttl
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.egress import Egress
from ezat_compat.upstream.providers import Event, Provider, beta_list, common_headers
from ezat_compat.upstream.providers.aws import AwsCredentials, needs_botocore
from ezat_compat.upstream.providers.betas import takes_cache_ttl, takes_output_format, told_format
from ezat_compat.upstream.providers.features import drop_gated_fields
from ezat_compat.upstream.sse import pulled

try:
    from botocore.eventstream import EventStreamBuffer, EventStreamMessage
except ImportError:  # pragma: no cover - the extra is installed in tests
    EventStreamBuffer = None

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


def aws_status_error(status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
    """An AWS error answer (``{"message": …}``, its type in ``x-amzn-ErrorType``) as
    Anthropic's envelope (``BEDROCK_ERRORS``); Anthropic's own envelope, and a body that is
    neither (something in between), as they came."""
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


class BedrockProvider(Provider):
    """A Bedrock deployment (module docstring)."""

    __slots__ = ("_aws", "_count_path", "_no_ttl", "_options", "_paths", "_told_format")
    name = "bedrock"
    rewrites = True

    def __init__(self, deployment: Deployment, egress: Egress | None = None) -> None:
        needs_botocore(deployment)
        super().__init__(deployment)
        model = quote(deployment.upstream_model, safe="")
        self._paths = (f"/model/{model}/invoke", f"/model/{model}/invoke-with-response-stream")
        self._count_path = f"/model/{quote(counting_model(deployment.upstream_model), safe='')}/count-tokens"
        self._aws = AwsCredentials(deployment, egress)
        self._options = invoke_options(deployment)
        self._no_ttl = not takes_cache_ttl(self.name, deployment.upstream_model)
        self._told_format = not takes_output_format(self.name, deployment.upstream_model)

    # -- the request ----------------------------------------------------------------------------

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
        """The botocore session the credentials are found with (``AwsCredentials.session``)."""
        return self._aws.session()

    def credentials(self) -> Any:
        """botocore's credentials (``AwsCredentials.get``)."""
        return self._aws.get()

    def authorize(self, request: requests.PreparedRequest) -> None:
        if self.deployment.api_key:
            return  # a Bedrock API key, already in the header fields
        options = self._options
        self._aws.sign(request, SERVICE, lambda name: name in _SIGNED_HEADERS or name in options)

    # -- the answer -----------------------------------------------------------------------------

    @staticmethod
    def decode(chunks: Iterable[bytes], *, before_read: Callable[[], None] | None = None) -> Iterator[Event]:
        return iter_event_stream(chunks, before_read=before_read)

    @staticmethod
    def decoder() -> EventStreamDecoder:
        return EventStreamDecoder()

    def status_error(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamStatusError:
        return aws_status_error(status, body, headers)

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
        lines.append(self._aws.describe())
        return lines


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

    def feed(self, chunk: bytes, most: int = 0) -> list[Event]:
        error = self._error
        if error is not None:
            self._error = None
            raise error
        self._buffer.add_data(chunk)
        out: list[Event] = []
        try:
            for message in self._buffer:  # decodes a message at a time: the rest wait in the buffer
                event = _event(message)
                if event is not None:
                    out.append(event)
                    if len(out) == most:
                        break
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
        # The messages a call cut short by ``most`` kept; what botocore holds after them is a
        # message the body's end cut off.
        return self.feed(b"")


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
