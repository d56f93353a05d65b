"""The simulator's WSGI app: routes, auth, fault injection, request recording, SSE writing.

A plain WSGI callable (no framework: it is the "direct call" floor of the benchmarks). It
sleeps with ``time.sleep``, so serve it with gevent's server in a monkey-patched process
(``server.main`` does both) to hold thousands of slow streams; embedded in a threaded server it
still works, one thread per open stream.

Routes:

    POST   /v1/messages               JSON or "stream": true (SSE)
    POST   /anthropic/v1/messages     the same, as Microsoft Foundry serves it (x-api-key or api-key;
                                      with --foundry-bearer, an Entra ID bearer only)
    POST   /azure/anthropic/v1/messages   a Foundry deployment hosted on Azure: the features it
                                      refuses are a 400 (``validate.azure_refusal``)
    POST   /model/{id}/invoke         Amazon Bedrock's InvokeModel, SigV4 verified (``clouds.py``)
    POST   /model/{id}/invoke-with-response-stream   ...its stream, AWS event-stream framing
    POST   /v1/projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict
                                      Vertex AI (and :streamRawPredict, SSE); bearer tokens of
    POST   /token                     this token endpoint (``--google-service-account FILE``)
    POST   /claude-platform-aws/v1/messages   Claude Platform on AWS: SigV4 for aws-external-anthropic
                                      (or x-api-key) and anthropic-workspace-id checked; SSE
    POST   /bedrock-mantle/anthropic/v1/messages   Bedrock's Messages endpoint, SigV4 for
                                      bedrock-mantle (or a bearer key); /bedrock-runtime/anthropic/…
                                      the same for bedrock. Each with /count_tokens (``clouds.py``)
    POST   /v1/messages/count_tokens  {"input_tokens": N}
    GET    /healthz                   {"status": "ok", "name": NAME}
    GET    /_sim/requests             {"requests": [{path, method, headers, body, time, name}]}
    DELETE /_sim/requests             forget the recorded requests
    GET    /_sim/stats                stream and request counters (see ``Stats``)
    DELETE /_sim/stats                reset the counters (``open_streams`` is a live gauge: kept)
    DELETE /_sim/cache                empty the prompt cache

Every answer carries ``request-id: req_…`` and ``x-sim-name``; errors use Anthropic's envelope.
The ``anthropic-version`` header of Anthropic's and Foundry's paths picks the API version's rules
(``validate.version_refusal``: 2026-10-21 refuses sampling fields and more).
"""

from __future__ import annotations

import errno
import json
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from http import HTTPStatus
from typing import Any

from ezat_compat.sim import clouds
from ezat_compat.sim.cache import PromptCache, count_input_tokens, prompt_units
from ezat_compat.sim.errors import STATUS_TO_ERROR_TYPE, InvalidRequestError, SimError, error_body
from ezat_compat.sim.events import OVERLOADED_EVENT, encode_event, message_events
from ezat_compat.sim.markers import Markers, parse_markers
from ezat_compat.sim.ratelimit import RateLimitedError, RequestBucket
from ezat_compat.sim.replies import build_reply, message_json
from ezat_compat.sim.request import last_user_text, utf8_json
from ezat_compat.sim.script import scripted_markers
from ezat_compat.sim.shape import EFFORTS
from ezat_compat.sim.validate import (
    MAX_BODY_BYTES,
    ModelCaps,
    azure_refusal,
    check_body_size,
    validate_request,
    version_refusal,
)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]
Handler = Callable[[Environ, StartResponse, str], Iterable[bytes]]

RETRY_AFTER_STATUSES = frozenset({429, 503, 529})
MIB = 1024 * 1024


@dataclass(frozen=True)
class SimConfig:
    """One simulator instance's behaviour; every default means "behave, and answer at once".

    ``fail_status`` answers that status (Anthropic's envelope) to a ``fail_rate`` share of
    ``/v1/messages`` requests, drawn from a ``random.Random(seed)`` so runs repeat;
    ``retry_after`` (seconds) goes with injected 429/503/529. ``latency_ms`` is waited before
    any ``/v1/messages`` answer. Streams: ``cut_after`` closes the connection after N events,
    ``stall_s`` waits after message_start and the ping, ``token_delay_ms`` between content
    deltas. ``api_key`` set: any other ``x-api-key`` gets 401. The model's capabilities
    (``validate.ModelCaps``): ``prefill=False`` refuses a trailing assistant message,
    ``temperature_with_top_p=True`` accepts both together (older models), ``efforts`` the
    ``output_config.effort`` levels offered, ``max_output_tokens`` the highest ``max_tokens``.
    Markers in a request override these per request.
    """

    name: str = "sim"
    fail_status: int | None = None
    fail_rate: float = 1.0
    seed: int = 0
    retry_after: float | None = None
    latency_ms: int = 0
    cut_after: int | None = None
    stall_s: float = 0.0
    token_delay_ms: int = 0
    min_cache_tokens: int = 1024
    api_key: str | None = None
    prefill: bool = True
    temperature_with_top_p: bool = False
    efforts: tuple[str, ...] = EFFORTS
    max_output_tokens: int = ModelCaps.max_output_tokens
    max_recorded: int = 500
    max_recorded_body_bytes: int = 8 * MIB
    max_body_bytes: int = MAX_BODY_BYTES
    cache_entries: int = 4096
    google_service_account: str = ""  # a service-account JSON file: its tokens are Vertex's credentials
    rpm_limit: int | None = None  # the organisation's requests a minute (Anthropic's paths): headers, then 429s
    foundry_bearer: str = ""  # set: Foundry's paths take only this Entra ID bearer (no key)

    def __post_init__(self) -> None:
        if self.fail_status is not None and not 400 <= self.fail_status <= 599:
            raise ValueError(f"fail_status must be between 400 and 599, not {self.fail_status}")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be between 0 and 1, not {self.fail_rate}")
        for name in ("latency_ms", "stall_s", "token_delay_ms", "min_cache_tokens", "max_recorded"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be at least 1, not {self.max_output_tokens}")
        if self.cut_after is not None and self.cut_after < 0:
            raise ValueError("cut_after must not be negative")
        if self.retry_after is not None and self.retry_after < 0:
            raise ValueError("retry_after must not be negative")
        if self.rpm_limit is not None and self.rpm_limit < 1:
            raise ValueError(f"rpm_limit must be at least 1, not {self.rpm_limit}")
        unknown = [e for e in self.efforts if e not in EFFORTS]
        if unknown:
            raise ValueError(f"unknown effort levels: {', '.join(unknown)} (known: {', '.join(EFFORTS)})")

    @property
    def caps(self) -> ModelCaps:
        """The simulated model's capabilities, for ``validate_request``."""
        return ModelCaps(
            prefill=self.prefill,
            temperature_with_top_p=self.temperature_with_top_p,
            efforts=self.efforts,
            max_output_tokens=self.max_output_tokens,
        )


@dataclass
class Stats:
    """Counters of ``GET /_sim/stats``.

    ``streams_completed``: the stream reached its planned end; ``streams_aborted``: the client
    went away first (the server closed the generator); ``streams_faulted``: ended by an injected
    cut or error event; ``open_streams``: streams being written now.
    """

    requests: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    streams_aborted: int = 0
    streams_faulted: int = 0
    open_streams: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a JSON-ready dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        """Zero every counter but the live ``open_streams`` gauge."""
        for f in fields(self):
            if f.name != "open_streams":
                setattr(self, f.name, 0)


@dataclass(frozen=True)
class StreamPlan:
    """The faults and delays of one stream (None / 0: none)."""

    cut_after: int | None = None
    error_after: int | None = None
    stall_s: float = 0.0
    token_delay_s: float = 0.0

    @property
    def fast(self) -> bool:
        """True when the whole stream can be written at once."""
        return self.cut_after is None and self.error_after is None and not self.stall_s and not self.token_delay_s


def _status_line(status: int) -> str:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = {529: "Overloaded"}.get(status, "Error")
    return f"{status} {phrase}"


_STATUS_LINES = {status: _status_line(status) for status in (*STATUS_TO_ERROR_TYPE, 200)}
_JSON = "application/json"
EVENT_STREAM = "application/vnd.amazon.eventstream"


def _dumps(payload: Any) -> bytes:
    """``payload`` as compact UTF-8 JSON. A lone surrogate (a client's ``"\\ud800"``, echoed in
    a reply or a refusal) has no UTF-8: it goes out as the same ``\\ud800`` escape
    (``request.utf8_json``)."""
    return utf8_json(json.dumps(payload, separators=(",", ":"), ensure_ascii=False))


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def _headers(environ: Environ) -> dict[str, str]:
    headers = {key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    if environ.get("CONTENT_LENGTH"):
        headers["content-length"] = environ["CONTENT_LENGTH"]
    return headers


def _sleep(seconds: float) -> None:
    time.sleep(seconds)  # looked up per call: gevent may patch ``time`` after this module is imported


def _api_key(environ: Environ) -> str:
    """The caller's key: ``x-api-key``, else an ``Authorization: Bearer`` token (the form the
    anthropic SDK 2.x sends); "" when neither is there."""
    key = environ.get("HTTP_X_API_KEY", "").strip()
    if key:
        return key
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Simulator:
    """The WSGI callable; its state (records, counters, prompt cache) lives for the process.

    Use one instance per simulated upstream. ``sleep`` is injectable for tests; by default it is
    ``time.sleep`` as patched (or not) when called.
    """

    def __init__(self, config: SimConfig, *, sleep: Callable[[float], None] | None = None) -> None:
        self.config = config
        self.stats = Stats()
        self.cache = PromptCache(config.cache_entries)
        self.requests: deque[dict[str, Any]] = deque(maxlen=config.max_recorded)
        self._rng = random.Random(config.seed)
        self._sleep = sleep or _sleep
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("GET", "/healthz"): self._healthz,
            ("GET", "/_sim/requests"): self._get_requests,
            ("DELETE", "/_sim/requests"): self._clear_requests,
            ("GET", "/_sim/stats"): self._get_stats,
            ("DELETE", "/_sim/stats"): self._reset_stats,
            ("DELETE", "/_sim/cache"): self._clear_cache,
        }
        self._routes[("POST", "/anthropic/v1/messages")] = self._messages  # Foundry's path
        self._routes[("POST", "/anthropic/v1/messages/count_tokens")] = self._count_tokens  # and its count
        self._routes[("POST", "/azure/anthropic/v1/messages")] = self._messages  # Foundry hosted on Azure
        self._routes[("POST", "/azure/anthropic/v1/messages/count_tokens")] = self._count_tokens
        self._routes[("POST", "/token")] = self._google_token
        self._paths = frozenset(path for _, path in self._routes)
        self._identity = ("x-sim-name", config.name)
        self._google = clouds.GoogleTokens(config.google_service_account) if config.google_service_account else None
        self._bucket = RequestBucket(config.rpm_limit, time.time) if config.rpm_limit else None

    # -- WSGI entry ---------------------------------------------------------------------------

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request_id = _new_id("req_")
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO") or "/"
        handler = self._routes.get((method, path))
        if handler is None and method == "POST":
            if path.startswith("/model/"):
                handler = self._bedrock
            elif path.startswith("/v1/projects/") and "/publishers/anthropic/models/" in path:
                handler = self._vertex
            elif clouds.aws_messages_route(path) is not None:
                handler = self._aws_messages
        try:
            if handler is None:
                if path in self._paths:
                    raise SimError(405, f"Method {method} is not allowed for {path}")
                raise SimError(404, f"Not found: {method} {path}")
            return handler(environ, start_response, request_id)
        except SimError as error:
            return self._error(start_response, error, request_id)
        except clouds.CloudError as error:
            return self._respond(start_response, error.status, error.body, request_id, error.headers)

    def _respond(
        self,
        start_response: StartResponse,
        status: int,
        payload: Any,
        request_id: str,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> list[bytes]:
        data = _dumps(payload)
        start_response(
            _STATUS_LINES.get(status) or _status_line(status),
            [
                ("content-type", _JSON),
                ("content-length", str(len(data))),
                ("request-id", request_id),
                self._identity,
                *extra,
            ],
        )
        return [data]

    def _error(self, start_response: StartResponse, error: SimError, request_id: str) -> list[bytes]:
        extra: tuple[tuple[str, str], ...] = ()
        if error.retry_after is not None:
            extra = (("retry-after", f"{error.retry_after:g}"),)
        if isinstance(error, RateLimitedError):
            extra += error.headers
        return self._respond(start_response, error.status, error_body(error, request_id), request_id, extra)

    # -- request reading ----------------------------------------------------------------------

    def _read_body(self, environ: Environ) -> bytes:
        stream = environ["wsgi.input"]
        limit = self.config.max_body_bytes
        length_text = environ.get("CONTENT_LENGTH")
        if length_text:
            try:
                length = int(length_text)
            except ValueError:
                raise InvalidRequestError("Invalid Content-Length header") from None
            check_body_size(length, limit)
            return stream.read(length) if length > 0 else b""
        if environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked":
            data = stream.read(limit + 1)
            check_body_size(len(data), limit)
            return data
        return b""

    def _receive(self, environ: Environ, path: str) -> Any:
        """Read, parse, record and authenticate an API request; return its parsed body."""
        _, body, parse_error = self._record(environ, path)
        foundry = path.startswith(("/anthropic/", "/azure/anthropic/"))
        if foundry and self.config.foundry_bearer:
            self._entra_bearer(environ)
        else:
            api_key = _api_key(environ) or environ.get("HTTP_API_KEY", "").strip()  # api-key: Foundry's other spelling
            if not api_key:
                raise SimError(401, "x-api-key header is required")
            if self.config.api_key is not None and api_key != self.config.api_key:
                raise SimError(401, "invalid x-api-key")
        if parse_error is not None:
            raise InvalidRequestError(f"There was an error parsing the body of your request: {parse_error}")
        if isinstance(body, dict):
            refused = version_refusal(body, environ.get("HTTP_ANTHROPIC_VERSION", "").strip())
            if refused is None and path.startswith("/azure/anthropic/"):
                refused = azure_refusal(body)
            if refused is not None:
                raise InvalidRequestError(refused)
        return body

    def _entra_bearer(self, environ: Environ) -> None:
        """Foundry with Entra ID: ``Authorization: Bearer`` with the token the test's token
        endpoint issued, and no key (Anthropic, "Claude in Microsoft Foundry": Entra ID tokens
        go as a bearer)."""
        scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if environ.get("HTTP_X_API_KEY") or environ.get("HTTP_API_KEY"):
            raise SimError(401, "this simulated resource takes Microsoft Entra ID tokens only, not a key")
        if scheme.lower() != "bearer" or token.strip() != self.config.foundry_bearer:
            raise SimError(401, "invalid bearer token")

    def _record(self, environ: Environ, path: str) -> tuple[bytes, Any, str | None]:
        """Read, parse and record a request: (raw body, parsed body, the parse error)."""
        raw = self._read_body(environ)
        parse_error: str | None = None
        try:
            body: Any = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past the interpreter's limit
            body, parse_error = None, str(exc)
        self.stats.requests += 1
        recorded = body if len(raw) <= self.config.max_recorded_body_bytes else {"_sim_truncated": len(raw)}
        self.requests.append(
            {
                "path": path,
                "method": environ.get("REQUEST_METHOD", "POST"),
                "headers": _headers(environ),
                "body": recorded,
                "time": time.time(),
                "name": self.config.name,
            }
        )
        if not path.endswith("/count_tokens") and self.config.latency_ms:
            self._sleep(self.config.latency_ms / 1000)
        return raw, body, parse_error

    # -- API routes ---------------------------------------------------------------------------

    def _messages(self, environ: Environ, start_response: StartResponse, request_id: str) -> Iterable[bytes]:
        body = self._receive(environ, environ.get("PATH_INFO") or "/v1/messages")
        limits = self._bucket.take() if self._bucket is not None else ()
        return self._answer(start_response, request_id, body, extra=limits)

    def _answer(
        self,
        start_response: StartResponse,
        request_id: str,
        body: Any,
        framing: str = "sse",
        extra: tuple[tuple[str, str], ...] = (),
        *,
        guarded: bool = False,
    ) -> Iterable[bytes]:
        """The reply to an Anthropic Messages body (``model`` and ``stream`` in it), JSON or a
        stream in ``framing`` ("sse", or "bedrock": AWS event-stream)."""
        validate_request(body, caps=self.config.caps)
        clean_text, markers = scripted_markers(body, *parse_markers(last_user_text(body)))
        if markers.delay:
            self._sleep(markers.delay)
        self._inject_fault(markers)
        usage = self.cache.account(body["model"], prompt_units(body), self.config.min_cache_tokens)
        reply = build_reply(body, clean_text, markers)
        message = message_json(body["model"], _new_id("msg_"), reply, usage)
        if guarded and markers.guardrail:
            message = clouds.guardrail_intervened(message)
        if body.get("stream"):
            return self._stream(start_response, request_id, message, self._plan(markers), framing, extra)
        return self._respond(start_response, 200, message, request_id, extra)

    # -- the clouds (clouds.py) -----------------------------------------------------------------

    def _bedrock(self, environ: Environ, start_response: StartResponse, request_id: str) -> Iterable[bytes]:
        """InvokeModel / InvokeModelWithResponseStream: SigV4 (or a Bedrock API key), Bedrock's
        body (no model, no stream, its anthropic_version, betas in the body) and errors."""
        path = environ.get("PATH_INFO") or "/"
        raw, body, parse_error = self._record(environ, path)
        model, _, operation = path[len("/model/") :].rpartition("/")
        if not model or operation not in ("invoke", "invoke-with-response-stream", "count-tokens"):
            raise clouds.bedrock_error(404, f"Unknown operation {path}", "UnknownOperationException")
        headers = _headers(environ)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":  # a Bedrock API key
            if not token.strip() or (self.config.api_key is not None and token.strip() != self.config.api_key):
                raise clouds.bedrock_error(403, "Invalid API Key format", "AccessDeniedException")
        else:
            url = clouds.bedrock_url(environ.get("HTTP_HOST", ""), model, operation)
            clouds.verify_sigv4("POST", url, headers, raw)
        if parse_error is not None or not isinstance(body, dict):
            raise clouds.bedrock_error(400, "Malformed input request, please reformat your input and try again.")
        counting = operation == "count-tokens"
        if counting:  # CountTokens: {"input": {"invokeModel": {"body": <base64 InvokeModel body>}}}
            body = clouds.count_tokens_input(model, body)
        for key in ("model", "stream"):
            if key in body:
                raise clouds.bedrock_error(400, f"Malformed input request: extraneous key [{key}] is not permitted")
        guarded, tier = clouds.invoke_options(headers) if not counting else (False, "")
        if body.get("anthropic_version") != clouds.BEDROCK_VERSION:
            raise clouds.bedrock_error(400, "Malformed input request: anthropic_version: invalid value")
        from ezat_compat.upstream.providers.betas import BEDROCK_BETAS  # the rules the gateway keeps

        betas = body.get("anthropic_beta", [])
        if not isinstance(betas, list) or any(
            b not in BEDROCK_BETAS or b in clouds.BEDROCK_REFUSED_BETAS for b in betas
        ):
            raise clouds.bedrock_error(400, "The model returned the following errors: invalid beta flag")
        url_source = clouds.url_source_path(body)
        if url_source is not None:
            raise clouds.bedrock_error(400, f"{url_source}: URL sources are not supported; send base64 data")
        missing = clouds.refused_tool("bedrock", body) or clouds.refused_cache_ttl(model, body)
        if missing is not None:
            raise clouds.bedrock_error(400, "The model returned the following errors: " + missing)
        config = body.get("output_config")
        if isinstance(config, dict) and "format" in config and clouds.refuses_output_format(model):
            raise clouds.bedrock_error(
                400, "The model returned the following errors: output_config.format: Extra inputs are not permitted"
            )
        inner = {k: v for k, v in body.items() if k not in ("anthropic_version", "anthropic_beta")}
        inner["model"] = model
        if counting:
            inner.pop("max_tokens", None)
            try:
                validate_request(inner, count_only=True, caps=self.config.caps)
            except SimError as error:
                raise clouds.bedrock_error(error.status, error.message) from None
            return self._respond(start_response, 200, {"inputTokens": count_input_tokens(inner)}, request_id)
        if operation == "invoke-with-response-stream":
            inner["stream"] = True
        try:
            return self._answer(
                start_response,
                request_id,
                inner,
                "bedrock",
                (("x-amzn-bedrock-service-tier", tier),),
                guarded=guarded,
            )
        except SimError as error:
            raise clouds.bedrock_error(error.status, error.message) from None

    def _aws_messages(self, environ: Environ, start_response: StartResponse, request_id: str) -> Iterable[bytes]:
        """Anthropic's Messages API on an AWS endpoint (``clouds.AWS_MESSAGES_PREFIXES``): the
        caller's key or SigV4 signature (and Claude Platform on AWS's workspace), then the
        request as Anthropic's API takes it, answered in JSON or SSE. On Bedrock's Messages
        endpoint, Bedrock's own refusals (betas, tools, URL sources, cache TTLs, structured
        outputs) hold as on InvokeModel."""
        path = environ.get("PATH_INFO") or "/"
        raw, body, parse_error = self._record(environ, path)
        prefix, counting = clouds.aws_messages_route(path) or ("", False)
        headers = _headers(environ)
        url = f"http://{environ.get('HTTP_HOST', '')}{path}"
        clouds.check_aws_caller(prefix, url, headers, raw, self.config.api_key)
        if parse_error is not None or not isinstance(body, dict):
            raise InvalidRequestError(f"There was an error parsing the body of your request: {parse_error}")
        refused = version_refusal(body, headers.get("anthropic-version", "").strip())
        if refused is None and prefix != clouds.CLAUDE_PLATFORM_AWS:
            refused = self._bedrock_messages_refusal(body, headers.get("anthropic-beta", ""))
        if refused is not None:
            raise InvalidRequestError(refused)
        if counting:
            validate_request(body, count_only=True, caps=self.config.caps)
            return self._respond(start_response, 200, {"input_tokens": count_input_tokens(body)}, request_id)
        return self._answer(start_response, request_id, body)

    @staticmethod
    def _bedrock_messages_refusal(body: dict[str, Any], beta: str) -> str | None:
        """What Bedrock refuses of an Anthropic Messages body and its ``anthropic-beta``."""
        from ezat_compat.upstream.providers.betas import BEDROCK_BETAS  # the rules the gateway keeps

        named = [b.strip() for b in beta.split(",") if b.strip()]
        if any(b not in BEDROCK_BETAS or b in clouds.BEDROCK_REFUSED_BETAS for b in named):
            return "invalid beta flag"
        url_source = clouds.url_source_path(body)
        if url_source is not None:
            return f"{url_source}: URL sources are not supported; send base64 data"
        model = str(body.get("model", ""))
        missing = clouds.refused_tool("bedrock", body) or clouds.refused_cache_ttl(model, body)
        if missing is not None:
            return missing
        config = body.get("output_config")
        if isinstance(config, dict) and "format" in config and clouds.refuses_output_format(model):
            return "output_config.format: Extra inputs are not permitted"
        return None

    def _vertex(self, environ: Environ, start_response: StartResponse, request_id: str) -> Iterable[bytes]:
        """rawPredict / streamRawPredict: a token of ``/token``, Vertex's body (no model, its
        anthropic_version) and Google's errors."""
        path = environ.get("PATH_INFO") or "/"
        _, body, parse_error = self._record(environ, path)
        model, _, operation = path.rpartition("/models/")[2].partition(":")
        if self._google is None:
            raise clouds.google_error(401, "The simulator has no service account (--google-service-account).")
        self._google.check(environ.get("HTTP_AUTHORIZATION", ""))
        if operation not in ("rawPredict", "streamRawPredict"):
            raise clouds.google_error(404, f"Unknown method {operation}")
        if parse_error is not None or not isinstance(body, dict):
            raise clouds.google_error(400, "Invalid JSON payload received.")
        counting = model == "count-tokens" and operation == "rawPredict"  # the model is in the body
        if counting and not isinstance(body.get("model"), str):
            raise clouds.google_error(400, "model: Field required")
        if "model" in body and not counting:
            raise clouds.google_error(400, "model: Extra inputs are not permitted")
        if body.get("anthropic_version") != clouds.VERTEX_VERSION:
            raise clouds.google_error(400, "anthropic_version: Input should be 'vertex-2023-10-16'")
        from ezat_compat.upstream.providers.betas import VERTEX_BETAS

        beta = environ.get("HTTP_ANTHROPIC_BETA", "")
        named = [b.strip() for b in beta.split(",") if b.strip()]
        refused = [b for b in named if b not in VERTEX_BETAS or b in clouds.VERTEX_REFUSED_BETAS]
        if refused:  # Anthropic's own envelope, as Vertex passes it on
            raise InvalidRequestError(f"Unexpected value(s) `{'`, `'.join(refused)}` for the `anthropic-beta` header.")
        url_source = clouds.url_source_path(body)
        if url_source is not None:
            raise InvalidRequestError(f"{url_source}: URL sources are not supported; send base64 data")
        missing = clouds.refused_tool("vertex", body)
        if missing is not None:  # Anthropic's envelope, as Vertex passes its validator's on
            raise InvalidRequestError(missing)
        inner = {k: v for k, v in body.items() if k != "anthropic_version"}
        if counting:
            validate_request(inner, count_only=True, caps=self.config.caps)
            return self._respond(start_response, 200, {"input_tokens": count_input_tokens(inner)}, request_id)
        inner["model"] = model
        inner["stream"] = operation == "streamRawPredict"
        try:
            return self._answer(start_response, request_id, inner)
        except SimError as error:
            if error.status == 400:
                raise
            raise clouds.google_error(error.status, error.message) from None

    def _google_token(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        if self._google is None:
            raise SimError(404, "Not found: POST /token (no --google-service-account)")
        form = self._read_body(environ)
        uri = f"http://{environ.get('HTTP_HOST', '')}/token"
        return self._respond(start_response, 200, self._google.grant(form, uri), request_id)

    def _count_tokens(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        body = self._receive(environ, environ.get("PATH_INFO") or "/v1/messages/count_tokens")
        validate_request(body, count_only=True, caps=self.config.caps)
        return self._respond(start_response, 200, {"input_tokens": count_input_tokens(body)}, request_id)

    def _inject_fault(self, markers: Markers) -> None:
        if markers.reject is not None:  # an Anthropic-style 400 naming a path of this request
            raise InvalidRequestError(f"{markers.reject}: rejected by the simulator")
        status = markers.status
        if status is not None:
            if not 400 <= status <= 599:
                raise InvalidRequestError("[[sim:…]] marker: status must be between 400 and 599")
            retry_after = markers.retry_after
        else:
            status = self.config.fail_status
            if status is None or (self.config.fail_rate < 1.0 and self._rng.random() >= self.config.fail_rate):
                return
            retry_after = None
        if retry_after is None and status in RETRY_AFTER_STATUSES:
            retry_after = self.config.retry_after
        raise SimError(status, retry_after=retry_after)

    def _plan(self, markers: Markers) -> StreamPlan:
        config = self.config
        delay_ms = markers.token_delay_ms if markers.token_delay_ms is not None else config.token_delay_ms
        return StreamPlan(
            cut_after=markers.cut if markers.cut is not None else config.cut_after,
            error_after=markers.error_after,
            stall_s=markers.stall if markers.stall is not None else config.stall_s,
            token_delay_s=delay_ms / 1000,
        )

    def _stream(
        self,
        start_response: StartResponse,
        request_id: str,
        message: dict[str, Any],
        plan: StreamPlan,
        framing: str = "sse",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> Iterator[bytes]:
        bedrock = framing == "bedrock"
        start_response(
            "200 OK",
            [
                (
                    "content-type",
                    "application/vnd.amazon.eventstream" if bedrock else "text/event-stream; charset=utf-8",
                ),
                ("cache-control", "no-cache"),
                ("request-id", request_id),
                self._identity,
                *extra,
            ],
        )
        if bedrock:
            overloaded = clouds.exception_message(
                "serviceUnavailableException", "Bedrock is unable to process your request."
            )
            return self._stream_body(
                message_events(message), plan, lambda _, data: clouds.chunk_message(data), overloaded
            )
        return self._stream_body(message_events(message), plan)

    def _stream_body(
        self,
        events: list[tuple[str, dict[str, Any]]],
        plan: StreamPlan,
        encode: Callable[[str, dict[str, Any]], bytes] = encode_event,
        overloaded: bytes = OVERLOADED_EVENT,
    ) -> Iterator[bytes]:
        """Write the events; count the stream's outcome once, whichever way it ends.

        A client that leaves makes the server close this generator (GeneratorExit at a
        ``yield``): counted as aborted. An injected cut raises ECONNRESET, which gevent's
        server treats as a dropped connection: it closes the socket without ending the chunked
        body, so the client sees the stream break.
        """
        stats = self.stats
        stats.streams_started += 1
        stats.open_streams += 1
        outcome = "streams_aborted"
        try:
            if plan.fast:
                yield b"".join(encode(name, data) for name, data in events)
                outcome = "streams_completed"
                return
            deltas = 0
            for number, (name, data) in enumerate(events, 1):
                if plan.error_after is not None and number > plan.error_after:
                    outcome = "streams_faulted"
                    yield overloaded
                    return
                if plan.cut_after is not None and number > plan.cut_after:
                    outcome = "streams_faulted"
                    raise ConnectionResetError(errno.ECONNRESET, "ezat-sim: injected stream cut")
                if name == "content_block_delta":
                    if deltas and plan.token_delay_s:
                        self._sleep(plan.token_delay_s)
                    deltas += 1
                yield encode(name, data)
                if number == 2 and plan.stall_s:
                    self._sleep(plan.stall_s)
            outcome = "streams_completed"
        finally:
            stats.open_streams -= 1
            setattr(stats, outcome, getattr(stats, outcome) + 1)

    # -- health and test hooks ----------------------------------------------------------------

    def _healthz(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        return self._respond(start_response, 200, {"status": "ok", "name": self.config.name}, request_id)

    def _get_requests(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        return self._respond(start_response, 200, {"requests": list(self.requests)}, request_id)

    def _clear_requests(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        self.requests.clear()
        return self._respond(start_response, 200, {"requests": []}, request_id)

    def _get_stats(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        return self._respond(start_response, 200, self.stats.as_dict(), request_id)

    def _reset_stats(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        self.stats.reset()
        return self._respond(start_response, 200, self.stats.as_dict(), request_id)

    def _clear_cache(self, environ: Environ, start_response: StartResponse, request_id: str) -> list[bytes]:
        self.cache.clear()
        return self._respond(start_response, 200, {"cleared": True}, request_id)


def make_app(config: SimConfig | None = None) -> Simulator:
    """A new simulator WSGI app (with its own records, counters and prompt cache)."""
    return Simulator(config or SimConfig())
