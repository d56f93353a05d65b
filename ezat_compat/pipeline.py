"""The gateway core shared by both dialects:
auth -> limits -> (validate -> translate, in the blueprints) -> route -> upstream -> bill.

``Gateway`` holds the process's collaborators (stores, limits, cooldowns, upstream client,
image fetcher, metrics) and exposes one method per phase. The blueprints call the phases in
order; the stream writers of ``streaming.py`` use ``settle`` and ``stream_failed`` too.
Spec: chat-completions.md "Streaming", "Errors"; issues 6 (routing, failover) and 7 (billing, limits).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ezat_compat.catalog import Catalog
from ezat_compat.cooldowns import Cooldowns
from ezat_compat.domain import Config, Deployment, Model, Usage
from ezat_compat.errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    UpstreamTimeoutError,
)
from ezat_compat.limits import RateLimits
from ezat_compat.metrics import Metrics
from ezat_compat.pricing import cost_micros, worst_case_micros
from ezat_compat.routing import plan
from ezat_compat.store.accounts import Accounts, AuthContext
from ezat_compat.store.ledger import CLIENT_CLOSED, STALE_RESERVATION, Ledger, LedgerEntry
from ezat_compat.translate.estimate import input_tokens_upper_bound
from ezat_compat.translate.request import ImageSlot
from ezat_compat.translate.response import usage_from_anthropic
from ezat_compat.translate.upstream_errors import rewrite_upstream_message
from ezat_compat.upstream.client import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStream,
    UpstreamStreamError,
    with_model,
)
from ezat_compat.upstream.client import (
    UpstreamTimeoutError as UpstreamTimeout,
)
from ezat_compat.upstream.imagefit import UpstreamImageLimits
from ezat_compat.upstream.images import ImageFetcher

log = logging.getLogger("ezat_compat")

STATUS_OK = 200

CHARS_PER_TOKEN = 4
SWEEP_EVERY_S = 600.0  # how often a worker releases reservations of workers that died


def _retry_after(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, math.ceil(seconds))


def upstream_to_gateway_error(
    exc: UpstreamError, *, source_map: Mapping[tuple[Any, ...], str] | None = None, timeout_s: float = 590
) -> GatewayError:
    """The one upstream-failure table (spec "Errors": the Anthropic statuses, 529 -> 503)."""
    retry = _retry_after(exc.retry_after)
    if isinstance(exc, UpstreamTimeout):
        return UpstreamTimeoutError(
            f'The request took longer than {timeout_s:g} seconds; stream it instead ("stream": true).'
        )
    if isinstance(exc, UpstreamConnectError):
        return GatewayError("The upstream provider could not be reached; try again shortly.", retry_after=retry)
    if isinstance(exc, UpstreamStreamError):
        return GatewayError("The upstream stream broke off before the reply was complete.")
    if not isinstance(exc, UpstreamStatusError):
        return GatewayError("The upstream provider failed.")
    status = exc.status
    if status == 400 or (400 <= status < 500 and status not in (401, 402, 403, 404, 413, 429)):
        message, param = rewrite_upstream_message(exc.message or "invalid request", source_map or {})
        return InvalidRequestError(message, param=param)
    if status in (401, 402, 403, 404):
        return GatewayError(
            f"The upstream deployment refused the gateway's request (HTTP {status}); "
            "this is a gateway configuration problem, not yours.",
            retry_after=retry,
        )
    if status == 413:
        return RequestTooLargeError(exc.message or "The request is too large for the upstream provider.")
    if status == 429:
        return RateLimitError(
            exc.message or "The upstream provider is rate limiting; retry later.", retry_after=retry or 1
        )
    if status in (503, 529):
        return OverloadedError(
            exc.message or "The upstream provider is overloaded; retry later.", retry_after=retry or 1
        )
    if status == 504:
        return UpstreamTimeoutError(exc.message or "The upstream provider timed out.")
    return GatewayError(exc.message or f"The upstream provider failed (HTTP {status}).", retry_after=retry)


def client_status(err: BaseException) -> int:
    """The status an OpenAI client gets for ``err`` (for the ledger and the metrics)."""
    return err.status if isinstance(err, GatewayError) else 500


# ---------------------------------------------------------------- one admitted request


def health_key(model: Model, deployment: Deployment) -> str:
    """Cooldowns are per model and deployment: one model's overload says nothing of another's."""
    return f"{model.id}/{deployment.name}"


@dataclass(slots=True)
class Call:
    """One admitted request, from its reservation to its ledger row."""

    request_id: str
    endpoint: str
    auth: AuthContext
    model: Model
    model_name: str
    session: str | None
    reserved_micros: int
    started: float
    max_tokens: int = 0
    deployment: str = ""
    settled: bool = False
    attempts: list[str] = field(default_factory=list)


def estimated_usage(usage: Usage, produced_chars: int, max_tokens: int) -> Usage:
    """Usage of a stream the client closed early: output estimated from what was produced,
    never above the output limit (the reservation covers that much, no more)."""
    estimate = math.ceil(produced_chars / CHARS_PER_TOKEN)
    if max_tokens > 0:
        estimate = min(estimate, max_tokens)
    return Usage(
        input_tokens=usage.input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        output_tokens=max(usage.output_tokens, estimate),
        reasoning_tokens=usage.reasoning_tokens,
    )


class Gateway:
    """The process's gateway core; built once by ``create_app``."""

    def __init__(
        self,
        config: Config,
        *,
        catalog: Catalog,
        accounts: Accounts,
        ledger: Ledger,
        limits: RateLimits,
        cooldowns: Cooldowns,
        upstream: UpstreamClient,
        images: ImageFetcher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.accounts = accounts
        self.ledger = ledger
        self.limits = limits
        self.cooldowns = cooldowns
        self.upstream = upstream
        self.images = images
        self.metrics = metrics
        self.clock = clock
        self.rand = rand
        self.timeout_s = config.gateway.upstream_timeout_s
        self.keepalive_s = config.gateway.keepalive_s
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S

    # ------------------------------------------------------------ auth, model, admission

    def authenticate(self, secret: str | None) -> AuthContext:
        if not secret:
            raise AuthenticationError(
                "Missing API key: send it as 'Authorization: Bearer ezat_sk_…' or in the 'x-api-key' header."
            )
        return self.accounts.authenticate(secret, datetime.now(UTC))

    def resolve(self, auth: AuthContext, name: Any) -> Model:
        """The model named by the client; 404 if unknown, 403 if the key may not use it."""
        model = self.catalog.resolve(name) if isinstance(name, str) else None
        if model is None:
            raise ModelNotFoundError(str(name))
        if not auth.allows(model.id, model.aliases):
            raise PermissionDeniedError(f"This key may not use the model `{name}`.", param="model")
        return model

    def admit(
        self,
        *,
        request_id: str,
        endpoint: str,
        auth: AuthContext,
        model: Model,
        model_name: str,
        session: str | None,
        body: Mapping[str, Any],
        max_tokens: int,
    ) -> Call:
        """Rate limits, then reserve the worst-case cost (429 / 402)."""
        if time.monotonic() >= self._next_sweep:
            self._sweep_stale_reservations()
        self.limits.admit(auth)
        bound = input_tokens_upper_bound(body, model.context_window)
        reserve = worst_case_micros(bound, max_tokens, model.price)
        self.ledger.reserve(auth, request_id, reserve)
        return Call(
            request_id=request_id,
            endpoint=endpoint,
            auth=auth,
            model=model,
            model_name=model_name,
            session=session,
            reserved_micros=reserve,
            started=time.monotonic(),
            max_tokens=max_tokens,
        )

    def _sweep_stale_reservations(self) -> None:
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        try:
            released = self.ledger.sweep_stale(STALE_RESERVATION, datetime.now(UTC))
        except Exception:
            log.exception("could not release stale reservations")
            return
        if released:
            log.warning(
                "released %d reservations older than %s (a worker died mid-request)", released, STALE_RESERVATION
            )

    def fetch_images(self, slots: list[ImageSlot], model: Model | None = None) -> None:
        """Download the image URLs and fit every image to ``model``'s upstream limits, in place
        (400 naming the part on failure). Spec: "Images and PDFs"."""
        if slots:
            self.images.prepare(slots, UpstreamImageLimits() if model is None else UpstreamImageLimits.of(model))

    # ------------------------------------------------------------ billing

    def settle(self, call: Call, usage: Usage | None, status: int, *, estimated: bool = False) -> None:
        """Write the ledger row and move the money, once. Failed requests cost nothing."""
        if call.settled:
            return
        call.settled = True
        billed = status in (STATUS_OK, CLIENT_CLOSED) and usage is not None
        usage = usage if billed and usage is not None else Usage()
        cost = cost_micros(usage, call.model.price) if billed else 0
        entry = LedgerEntry(
            created_at=datetime.now(UTC),
            org_id=call.auth.org_id,
            key_id=call.auth.key_id,
            endpoint=call.endpoint,
            model=call.model_name,
            canonical_model=call.model.id,
            deployment=call.deployment,
            usage=usage,
            cost_micros=cost,
            status=status,
            estimated=estimated,
        )
        try:
            self.ledger.settle(call.request_id, entry)
        except Exception:
            self.metrics.billing_errors.inc()
            log.exception("could not record usage of request %s", call.request_id)
        if billed:
            try:
                self.limits.record_tokens(call.auth, usage.prompt_tokens + usage.output_tokens)
            except Exception:
                log.exception("could not count tokens of request %s", call.request_id)
        self.metrics.requests.labels(call.endpoint, call.model.id, call.deployment or "-", str(status)).inc()

    @contextlib.contextmanager
    def settling_failures(
        self,
        call: Call,
        upstream_error: Callable[[UpstreamError], Exception],
        status_of: Callable[[BaseException], int] | None = None,
    ) -> Iterator[None]:
        """Inside this block a failure is settled at no cost, with the status the client gets,
        then raised: upstream failures as ``upstream_error`` maps them, the rest as they are."""
        status_of = status_of or client_status
        try:
            yield
        except UpstreamError as exc:
            err = upstream_error(exc)
            self.settle(call, None, status_of(err))
            raise err from None
        except BaseException as err:
            self.settle(call, None, status_of(err))
            raise

    # ------------------------------------------------------------ routing and failover

    def _attempts(self, call: Call) -> Iterator[Deployment]:
        deployments = call.model.deployments
        order = deployments if len(deployments) == 1 else plan(deployments, session=call.session, rand=self.rand)
        for deployment in order:
            if self.cooldowns.acquire(health_key(call.model, deployment), self.clock()):
                yield deployment

    def _failed(self, call: Call, deployment: Deployment, exc: UpstreamError) -> None:
        if isinstance(exc, UpstreamStatusError) and not exc.failover:
            self.cooldowns.success(health_key(call.model, deployment))  # it answered: the client's fault
            return
        self.cooldowns.failure(health_key(call.model, deployment), self.clock(), exc.retry_after)
        reason = str(exc.status) if isinstance(exc, UpstreamStatusError) else type(exc).__name__
        self.metrics.failovers.labels(call.model.id, deployment.name, reason).inc()
        log.warning("deployment %s failed for request %s: %s", deployment.name, call.request_id, exc.message)

    def _exhausted(self, call: Call, last: UpstreamError | None) -> UpstreamError:
        if last is not None:
            return last
        return UpstreamStatusError(
            529,
            json.dumps(
                {
                    "type": "error",
                    "error": {
                        "type": "overloaded_error",
                        "message": f"No deployment of model {call.model.id} is available right now; retry shortly.",
                    },
                }
            ).encode(),
            {"retry-after": str(max(1, int(self.config.gateway.cooldown_s)))},
        )

    def complete(
        self,
        call: Call,
        path: str,
        body: bytes,
        *,
        stream_flag: bool | None = False,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """A non-streaming upstream call with failover; raises the last ``UpstreamError``."""
        deadline = call.started + self.timeout_s
        last: UpstreamError | None = None
        for deployment in self._attempts(call):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            call.deployment = deployment.name
            call.attempts.append(deployment.name)
            started = time.monotonic()
            try:
                data, response_headers = self.upstream.complete(
                    deployment,
                    path,
                    with_model(body, deployment.upstream_model, stream=stream_flag),
                    timeout_s=remaining,
                    headers=headers,
                )
            except UpstreamError as exc:
                self._failed(call, deployment, exc)
                if not exc.failover:
                    raise
                last = exc
                continue
            self.cooldowns.success(health_key(call.model, deployment))
            self.metrics.upstream_latency.labels(deployment.name, "false").observe(time.monotonic() - started)
            return data, response_headers
        if last is None and time.monotonic() >= deadline:
            last = UpstreamTimeout("no deployment answered in time")
        raise self._exhausted(call, last)

    def open_stream(
        self, call: Call, path: str, body: bytes, *, headers: Mapping[str, str] | None = None
    ) -> tuple[UpstreamStream, Iterator[tuple[str, str]], tuple[str, str]]:
        """Open a stream with failover until its first event arrives (nothing has reached the
        client yet, so another deployment may still take it). Returns the stream, its event
        iterator and the first event."""
        last: UpstreamError | None = None
        for deployment in self._attempts(call):
            call.deployment = deployment.name
            call.attempts.append(deployment.name)
            started = time.monotonic()
            stream: UpstreamStream | None = None
            try:
                stream = self.upstream.open_stream(
                    deployment, path, with_model(body, deployment.upstream_model, stream=True), headers=headers
                )
                events = stream.events()
                first = next(events, None)
                if first is None:
                    raise UpstreamStreamError("the upstream stream ended before its first event")
                if first[0] == "error":
                    raise _first_event_error(first[1])
            except UpstreamError as exc:
                if stream is not None:
                    stream.close()
                if isinstance(exc, UpstreamStreamError):
                    exc.failover = True  # nothing reached the client yet
                self._failed(call, deployment, exc)
                if not exc.failover:
                    raise
                last = exc
                continue
            self.metrics.ttfb.labels(deployment.name).observe(time.monotonic() - started)
            return stream, events, first
        raise self._exhausted(call, last)

    # ------------------------------------------------------------ stream writers

    def abandoned(self, call: Call, stream: UpstreamStream, first: tuple[str, str]) -> None:
        """The client left before the stream's first chunk was sent: close the upstream and
        bill the input the upstream already counted (``message_start``), estimated."""
        stream.close()
        message = parse_event(first[1]).get("message") if first[0] == "message_start" else None
        usage = usage_from_anthropic(message.get("usage") if isinstance(message, dict) else None)
        self.settle(call, usage, CLIENT_CLOSED, estimated=True)

    def stream_failed(self, call: Call, deployment: Deployment, failure: GatewayError) -> None:
        """A stream broke after it started: the deployment failed, the request costs nothing."""
        self.cooldowns.failure(health_key(call.model, deployment), self.clock(), None)
        self.settle(call, None, failure.status)


def _first_event_error(data: str) -> UpstreamStatusError:
    """An ``error`` event as the very first event: treated like the matching HTTP status."""
    payload = parse_event(data)
    error = payload.get("error") if isinstance(payload.get("error"), dict) else {}
    status = {
        "overloaded_error": 529,
        "rate_limit_error": 429,
        "api_error": 500,
        "invalid_request_error": 400,
        "timeout_error": 504,
    }.get(str(error.get("type")), 500)
    return UpstreamStatusError(status, json.dumps({"type": "error", "error": error}).encode(), {})


def parse_event(data: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except ValueError:
        raise UpstreamStreamError("the upstream sent an event that is not JSON") from None
    return parsed if isinstance(parsed, dict) else {}
