"""The pipeline: one owner per request, one order for every dialect.

    key -> body -> parse (validate, translate) -> limits and admission -> images
        -> route and failover -> upstream -> translate back -> bill

``Gateway.handle(dialect, request)`` runs those phases and returns a ``Reply`` (JSON) or a
``StreamSession`` (a started stream, for the writer in ``api/sse.py``). Before admission a
failure simply raises (nothing is held). After admission every exit — success, an upstream
failure, a bug while encoding or translating, the client leaving, the worker shutting down —
goes through ``Run.settle``: the ledger row is written and the reservation released, once.
Chat Completions reference, "Streaming" and "Errors" (failed requests aren't billed).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ezat_compat.catalog import Catalog, ModelAccess
from ezat_compat.cooldowns import Cooldowns
from ezat_compat.cooperative import tools
from ezat_compat.dialects import Dialect, Headers, KeptThinking, Parsed, ReplyIds
from ezat_compat.domain import Config, Deployment, Model, Price, Usage
from ezat_compat.endpoints import offers
from ezat_compat.errors import (
    DEPLOYMENT_FAULT_STATUSES,
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    UpstreamAuthError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamStreamError,
    UpstreamTimeoutError,
)
from ezat_compat.limits import RateLimits, TokenHold
from ezat_compat.pricing import capped_usage, cost_micros, worst_case_micros
from ezat_compat.routing import plan
from ezat_compat.server.logs import RequestRecord
from ezat_compat.server.metrics import Metrics
from ezat_compat.server.telemetry import Tracing, UpstreamAttempt
from ezat_compat.session import StreamSession
from ezat_compat.store.accounts import KEY_PREFIX, Accounts, AuthContext
from ezat_compat.store.hotpath import Rider
from ezat_compat.store.ledger import CLIENT_CLOSED, STALE_RESERVATION, Ledger, LedgerEntry
from ezat_compat.store.thinking import ThinkingStash
from ezat_compat.translate.body_json import BodyError, decode_body
from ezat_compat.translate.cache_scope import CacheScopes, needs_scope, scope_cache
from ezat_compat.translate.estimate import bound_web_searches, input_tokens_upper_bound
from ezat_compat.translate.request import ImageSlot
from ezat_compat.translate.versions import strict, version_takers
from ezat_compat.upstream.bodies import encode_body
from ezat_compat.upstream.client import UpstreamClient, UpstreamStream
from ezat_compat.upstream.headroom import Headroom
from ezat_compat.upstream.imagefit import UpstreamImageLimits
from ezat_compat.upstream.images import ImageFetcher
from ezat_compat.upstream.providers.features import RESTRICTED, provider_of, takers

if TYPE_CHECKING:  # built by app.build_gateway only with [identity] jwt_bearers = true
    from ezat_compat.idp.bearer import BearerTokens

log = logging.getLogger("ezat_compat")

STATUS_OK = 200
SWEEP_EVERY_S = 600.0  # how often a worker releases reservations of workers that died
MISSING_KEY = "Missing API key: send it as 'Authorization: Bearer ezat_sk_…' or in the 'x-api-key' header."


@dataclass(slots=True)
class ClientRequest:
    """What the pipeline needs of an HTTP request (the blueprint builds it; no Flask below)."""

    request_id: str
    api_key: str | None
    headers: Headers  # looked up case-insensitively
    read_body: Callable[[], bytes]  # 413 raises
    connected: Callable[[], bool] = lambda: True  # is the client still there (a cheap peek)?
    record: RequestRecord = field(default_factory=RequestRecord)  # what the request log says


@dataclass(frozen=True, slots=True)
class Reply:
    """A JSON answer: the body's bytes and the status."""

    body: bytes
    status: int = STATUS_OK


def reserve_price(model: Model) -> Price:
    """The price a reservation assumes: each field's highest among the model's and its
    deployments' own (``price`` per deployment), so a request served anywhere is covered."""
    prices = [model.price, *(d.price for d in model.deployments if d.price is not None)]
    if len(prices) == 1:
        return model.price
    return Price(
        input=max(p.input for p in prices),
        output=max(p.output for p in prices),
        cache_write=max(p.cache_write for p in prices),
        cache_read=max(p.cache_read for p in prices),
        web_search=max(p.web_search for p in prices),
    )


def usable(deployment: Deployment) -> bool:
    """Has what it authenticates with: its key, or no key needed (SigV4, Google's credentials)."""
    return bool(deployment.api_key) or not deployment.needs_key


def configuration_fault(exc: UpstreamError) -> bool:
    """The deployment's own key, credential or model is wrong (its 401-404, or no cloud
    credentials): another deployment is tried, but the deployment isn't cooled down, so a model
    whose every deployment is misconfigured keeps answering the spec's 500 ``server_error`` (the
    client's key was fine) rather than, once cooled, an overload that says to retry shortly."""
    if isinstance(exc, UpstreamAuthError):
        return True
    return (
        isinstance(exc, UpstreamStatusError) and exc.status_code in DEPLOYMENT_FAULT_STATUSES and not exc.from_between
    )


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
    input_bound: int = 0  # the input tokens and web searches the reservation covers (``capped_usage``)
    search_bound: int = 0
    deployment: str = ""
    settled: bool = False
    billed: bool = True
    attempts: list[str] = field(default_factory=list)
    record: RequestRecord = field(default_factory=RequestRecord)
    tokens: TokenHold | None = None  # the tpm reservation, settled to the real count
    price: Price | None = None  # the serving deployment's own price, when it has one


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
        thinking: ThinkingStash,
        cache_scopes: CacheScopes | None = None,
        tracing: Tracing | None = None,
        bearers: BearerTokens | None = None,
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
        self.thinking = thinking
        # each organisation's prompt-cache scope (None: ``isolate_prompt_cache = false``)
        self.cache_scopes = cache_scopes
        self.tracing = tracing  # None: telemetry off (every hook below is one ``is None`` test)
        self.bearers = bearers  # the IdP's JWTs as bearers (None: [identity] jwt_bearers = false)
        self.clock = clock
        self.rand = rand
        self.open_streams: set[StreamSession] = set()  # for a shutdown that must end them
        self.headroom = Headroom()  # deployments low on their own limits, tried after the others
        self.timeout_s = config.gateway.upstream_timeout_s
        self.keepalive_s = config.gateway.keepalive_s
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        self._reserve_prices = {model.id: reserve_price(model) for model in config.models}
        # the models with a deployment whose provider refuses some tools (``features.takers``)
        self._restricted = frozenset(
            model.id for model in config.models if any(provider_of(d) in RESTRICTED for d in model.deployments)
        )
        # the models with a deployment whose API version refuses some fields (``version_takers``)
        self._versioned = frozenset(
            model.id for model in config.models if any(strict(d.anthropic_version) for d in model.deployments)
        )

    # ------------------------------------------------------------ the request, end to end

    def cut_streams(self, failure: GatewayError) -> int:
        """End every open stream with ``failure`` (the grace of a shutdown runs out); how many."""
        streams = list(self.open_streams)
        for session in streams:
            session.request_cut(failure)
        return len(streams)

    def handle(self, dialect: Dialect, request: ClientRequest) -> Reply | StreamSession:
        """Run one request of ``dialect``; ``GatewayError`` raises carry what the client gets."""
        record = request.record
        record.route = dialect.endpoint
        if self.tracing is not None:
            record.trace = self.tracing.request(request.headers, dialect.endpoint, record.started)
        auth = self.authenticate(request.api_key)
        record.org, record.key = auth.org_name, auth.key_public_id
        if auth.user_id is not None:
            record.user = auth.user_public_id
        try:
            body = decode_body(request.read_body(), pause=tools().pause)  # a huge body shares the loop
        except BodyError as exc:
            path = dialect.body_path(exc.path) if exc.path else None
            raise InvalidRequestError(f"{path}: {exc.message}" if path else exc.message, param=path) from None
        parsed = dialect.parse(body, request.headers, ModelAccess(self.catalog, auth, record))
        counted = False
        if parsed.prepare is not None:  # the organisation's own state (a stored conversation):
            self.limits.count_request(auth)  # loaded only for a key within its rpm
            if parsed.billed:  # and one that can still pay for a turn
                self.ledger.check_funds(auth, 1)
            counted = True
            parsed.prepare(parsed, auth.org_id)
        if parsed.thinking_ids:  # thinking kept from earlier rounds of a tool loop
            dialect.restore_thinking(parsed, self.thinking.get(auth.org_id, parsed.thinking_ids, self.clock()))
        call = self.admit(
            request.request_id, dialect.endpoint, auth, parsed, status_of=dialect.status_of, counted=counted
        )
        call.record = record
        if record.trace is not None:
            record.trace.admitted(parsed.model_name, parsed.stream, parsed.max_tokens)
        return Run(self, dialect, parsed, call, request.connected).go()

    def authenticate(self, secret: str | None) -> AuthContext:
        """Who is calling with ``secret``: a key (``ezat_sk_…``), or with ``[identity]
        jwt_bearers`` a JWT of the IdP (``idp/bearer.py``); anything else is an invalid key."""
        if not secret:
            raise AuthenticationError(MISSING_KEY)
        bearers = self.bearers
        if bearers is not None and not secret.startswith(KEY_PREFIX) and bearers.takes(secret):
            return bearers.authenticate(secret, datetime.now(UTC))
        return self.accounts.authenticate(secret, datetime.now(UTC))

    def admit(
        self,
        request_id: str,
        endpoint: str,
        auth: AuthContext,
        parsed: Parsed,
        *,
        status_of: Callable[[GatewayError], int] | None = None,
        counted: bool = False,
    ) -> Call:
        """Rate limits, then reserve the worst-case cost (429 / 402); unbilled requests reserve
        nothing, but are refused (402) when the key couldn't pay for the same request with one
        token of output: it would make the gateway do a completion's work (images) for free.
        ``status_of``: the dialect's status of an error (for a reserve lost with the database,
        whose ledger row says what the client got). ``counted``: the request was already counted
        against the key's rpm (``RateLimits.count_request``)."""
        if time.monotonic() >= self._next_sweep:
            self._sweep_stale_reservations()
        reserve = bound = searches = 0
        if parsed.billed:  # the worst case is known before anything is held
            bound = input_tokens_upper_bound(parsed.body, parsed.model.context_window)
            searches = bound_web_searches(parsed.body, self.config.gateway.web_search_max_uses)
            price = self._reserve_prices.get(parsed.model.id) or parsed.model.price
            reserve = worst_case_micros(bound, parsed.max_tokens, price, searches)
        tokens = self.limits.admit(auth, bound + parsed.max_tokens if parsed.billed else 0, counted=counted)
        if not parsed.billed:  # a completion's work (the upstream's, images): for a key that could pay for one
            try:
                price = self._reserve_prices.get(parsed.model.id) or parsed.model.price
                self.ledger.check_funds(
                    auth,
                    worst_case_micros(input_tokens_upper_bound(parsed.body, parsed.model.context_window), 1, price),
                )
            except BaseException:
                self.limits.settle_tokens(tokens, 0)
                raise
        if parsed.billed:
            try:
                self.ledger.reserve(
                    auth,
                    request_id,
                    reserve,
                    endpoint=endpoint,
                    model=parsed.model_name,
                    canonical_model=parsed.model.id,
                    status_of=status_of,
                )
            except BaseException:
                self.limits.settle_tokens(tokens, 0)
                raise
        return Call(
            request_id=request_id,
            endpoint=endpoint,
            auth=auth,
            model=parsed.model,
            model_name=parsed.model_name,
            session=parsed.session,
            reserved_micros=reserve,
            started=time.monotonic(),
            max_tokens=parsed.max_tokens,
            input_bound=bound,
            search_bound=searches,
            billed=parsed.billed,
            tokens=tokens,
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

    def fetch_images(self, slots: list[ImageSlot], model: Model, org_id: int) -> None:
        """Download the image URLs and fit every image to ``model``'s upstream limits, in place
        (400 naming the part on failure), on organization ``org_id``'s share of the download
        pool. Spec: "Images and PDFs"."""
        if slots:
            self.images.prepare(slots, UpstreamImageLimits.of(model), org=str(org_id))

    # ------------------------------------------------------------ billing

    def settle(
        self, call: Call, usage: Usage | None, status: int, *, estimated: bool = False, rider: Rider | None = None
    ) -> None:
        """Write the ledger row and move the money, once. Failed requests cost nothing.
        ``rider``: the dialect's record of the reply (a stored response), written with the row."""
        if rider is not None and (call.settled or not call.billed):
            self._write_alone(rider)  # no row to ride with
        if call.settled:
            return
        call.settled = True
        call.record.settled(status, call.deployment, len(call.attempts))  # counted by the request log
        if not call.billed:
            return
        billed = status in (STATUS_OK, CLIENT_CLOSED) and usage is not None
        usage = usage if billed and usage is not None else Usage()
        cost = 0
        if billed:
            capped = capped_usage(usage, call.input_bound, call.max_tokens, call.search_bound)
            cost = cost_micros(capped, call.price or call.model.price)
            if capped is not usage or cost > call.reserved_micros:
                self._excess(call, usage)
                usage, cost = capped, min(cost, call.reserved_micros)
        call.record.billed(usage, cost)
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
        try:  # the database, or when it fails the fsynced journal (replayed later): before [DONE]
            self.ledger.settle_durably(call.request_id, entry, rider)
        except Exception:
            self.metrics.billing_errors.inc()
            log.exception("could not record usage of request %s", call.request_id)
        try:
            self.limits.settle_tokens(call.tokens, usage.prompt_tokens + usage.output_tokens if billed else 0)
        except Exception:
            log.exception("could not count tokens of request %s", call.request_id)

    def _excess(self, call: Call, usage: Usage) -> None:
        """The upstream reported more than the request could use: billed at the reservation's
        cap, logged and counted (``ezat_upstream_usage_excess_total``) for an operator to alert on."""
        self.metrics.child(self.metrics.usage_excess, call.model.id, call.deployment).inc()
        log.warning(
            "deployment %s reported usage past request %s's reservation (input bound %d, max_tokens %d, "
            "web searches %d): %s; billed at the cap",
            call.deployment,
            call.request_id,
            call.input_bound,
            call.max_tokens,
            call.search_bound,
            usage,
        )

    def _write_alone(self, rider: Rider) -> None:
        try:
            self.ledger.hot.write(rider.work, rider.params)
        except Exception as exc:
            rider.failed(exc)

    # ------------------------------------------------------------ routing and failover

    def _attempts(self, call: Call, path: str, source: Mapping[str, Any] | None) -> Iterator[Deployment]:
        # A deployment whose key variable is unset is skipped (start-up warned about it); with none
        # left the request fails saying which variable to set. A deployment whose provider refuses
        # a tool the request declares is passed over (``takers``), and one whose API version
        # refuses a field of the request that can't be dropped (``version_takers``).
        deployments = tuple(d for d in call.model.deployments if usable(d) and offers(d.provider, path))
        if not deployments and any(usable(d) for d in call.model.deployments):
            raise GatewayError(f"No deployment of model {call.model.id} offers {path} (its providers don't).")
        if not deployments:
            names = sorted({d.api_key_env for d in call.model.deployments})
            raise GatewayError(
                f"No deployment of model {call.model.id} has an upstream key: "
                f"set {' or '.join(names)} in the gateway's environment."
            )
        if source is not None and call.model.id in self._restricted:
            deployments = takers(call.model.id, deployments, source)
        if source is not None and call.model.id in self._versioned:
            deployments = version_takers(call.model.id, deployments, source)
        order: Sequence[Deployment] = deployments
        if len(deployments) > 1:
            order = plan(deployments, session=call.session, rand=self.rand)
            if self.headroom:  # some deployment said it is low on its limits
                order = self.headroom.last(order, lambda d: health_key(call.model, d), self.clock())
        for deployment in order:
            if self.cooldowns.acquire(health_key(call.model, deployment), self.clock()):
                yield deployment

    def _heard(self, model: Model, deployment: Deployment, headers: Mapping[str, str]) -> None:
        """What an answer's header fields say of the deployment's own limits: its place in the
        next orders (``headroom.py``) and the remaining-quota gauge."""
        for limit, left in self.headroom.learn(health_key(model, deployment), headers, self.clock()):
            self.metrics.child(self.metrics.upstream_remaining, model.id, deployment.name, limit).set(left)

    def _failed(
        self, call: Call, deployment: Deployment, exc: UpstreamError, attempt: UpstreamAttempt | None = None
    ) -> None:
        if attempt is not None:
            attempt.failed(exc, exc.status_code if isinstance(exc, UpstreamStatusError) else None)
        if isinstance(exc, UpstreamStatusError) and not exc.failover:
            self.cooldowns.success(health_key(call.model, deployment))  # it answered: the client's fault
            return
        if not configuration_fault(exc):  # a wrong key or credential is no overload: never "retry shortly"
            self.cooldowns.failure(health_key(call.model, deployment), self.clock(), exc.upstream_retry_after)
        reason = str(exc.status_code) if isinstance(exc, UpstreamStatusError) else type(exc).__name__
        self.metrics.child(self.metrics.failovers, call.model.id, deployment.name, reason).inc()
        log.warning("deployment %s failed for request %s: %s", deployment.name, call.request_id, exc.message)

    def _exhausted(self, call: Call, last: UpstreamError | None) -> UpstreamError:
        if last is not None:
            return last
        error = {
            "type": "overloaded_error",
            "message": f"No deployment of model {call.model.id} is available right now; retry shortly.",
        }
        now = self.clock()
        keyed = [d for d in call.model.deployments if usable(d)] or call.model.deployments
        wait = min(self.cooldowns.wait_s(health_key(call.model, d), now) for d in keyed)
        return UpstreamStatusError(
            529, json.dumps({"type": "error", "error": error}).encode(), {"retry-after": str(max(1, math.ceil(wait)))}
        )

    def complete(
        self,
        call: Call,
        path: str,
        body: bytes,
        *,
        stream_flag: bool | None = False,
        headers: Mapping[str, str] | None = None,
        source: Mapping[str, Any] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """A non-streaming upstream call with failover; raises the last ``UpstreamError``.
        ``body`` is serialized without ``model``; ``source`` is the same as data (a cloud
        deployment's provider reshapes it)."""
        deadline = call.started + self.timeout_s
        last: UpstreamError | None = None
        for deployment in self._attempts(call, path, source):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            call.deployment = deployment.name
            call.price = deployment.price
            call.attempts.append(deployment.name)
            started = time.monotonic()
            trace = call.record.trace
            attempt = trace.attempt(deployment, len(call.attempts)) if trace is not None else None
            try:
                data_out, headers_out = self.upstream.shape(
                    deployment, body, source=source, stream=stream_flag, headers=headers, path=path
                )
                data, response_headers = self.upstream.complete(
                    deployment,
                    path,
                    data_out,
                    timeout_s=remaining,
                    headers=headers_out,
                    trace=attempt.headers if attempt is not None else None,
                )
            except UpstreamError as exc:
                self._failed(call, deployment, exc, attempt)
                if not exc.failover:
                    raise
                last = exc
                continue
            except BaseException as exc:
                if attempt is not None:
                    attempt.failed(exc)
                raise
            if attempt is not None:
                attempt.answered()
            self.cooldowns.success(health_key(call.model, deployment))
            self.metrics.child(self.metrics.upstream_latency, call.model.id, deployment.name, "false").observe(
                time.monotonic() - started
            )
            self._heard(call.model, deployment, response_headers)
            return data, response_headers
        if last is None and time.monotonic() >= deadline:
            last = UpstreamTimeoutError("no deployment answered in time")
        raise self._exhausted(call, last)

    def open_stream(
        self,
        call: Call,
        path: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        source: Mapping[str, Any] | None = None,
    ) -> tuple[UpstreamStream, tuple[str, str]]:
        """Open a stream with failover until its first event arrives (nothing has reached the
        client yet, so another deployment may still take it). A deployment that hasn't sent its
        headers and first event within ``first_event_timeout_s`` is a failed attempt (cooled as
        any other). Returns the stream and its first event (the rest of its read stays pending)."""
        last: UpstreamError | None = None
        for deployment in self._attempts(call, path, source):
            call.deployment = deployment.name
            call.price = deployment.price
            call.attempts.append(deployment.name)
            started = time.monotonic()
            stream: UpstreamStream | None = None
            trace = call.record.trace
            attempt = trace.attempt(deployment, len(call.attempts)) if trace is not None else None
            try:
                data_out, headers_out = self.upstream.shape(
                    deployment, body, source=source, stream=True, headers=headers, path=path
                )
                stream = self.upstream.open_stream(
                    deployment,
                    path,
                    data_out,
                    headers=headers_out,
                    first_event_timeout_s=self.config.gateway.first_event_timeout_s,
                    trace=attempt.headers if attempt is not None else None,
                )
                first = stream.first()
                if first is None:
                    raise UpstreamStreamError("the upstream stream ended before its first event")
                if first[0] == "error":
                    raise UpstreamStatusError.from_event(_event_error(first[1]))
            except BaseException as exc:  # closed whatever stopped it: its reader stops too
                if stream is not None:
                    stream.close()
                if not isinstance(exc, UpstreamError):  # a bug, or this greenlet killed
                    if attempt is not None:
                        attempt.failed(exc)
                    raise
                if isinstance(exc, UpstreamStreamError):
                    exc.failover = True  # nothing reached the client yet
                self._failed(call, deployment, exc, attempt)
                if not exc.failover:
                    raise
                last = exc
                continue
            self.metrics.child(self.metrics.ttfb, call.model.id, deployment.name).observe(time.monotonic() - started)
            self._heard(call.model, deployment, stream.headers)
            if attempt is not None:
                attempt.answered()
            return stream, first
        raise self._exhausted(call, last)


def _event_error(data: str) -> Mapping[str, Any]:
    """The error object of an ``error`` event (empty when the event is odd)."""
    try:
        payload = json.loads(data)
    except ValueError:
        raise UpstreamStreamError("the upstream sent an event that is not JSON") from None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else {}


class Run:
    """One admitted request from its upstream call to its ledger row; the owner of its stream."""

    __slots__ = ("call", "connected", "deployment", "dialect", "gw", "parsed", "session", "started")

    def __init__(
        self, gw: Gateway, dialect: Dialect, parsed: Parsed, call: Call, connected: Callable[[], bool]
    ) -> None:
        self.gw = gw
        self.connected = connected
        self.dialect = dialect
        self.parsed = parsed
        self.call = call
        self.deployment: Deployment | None = None
        self.session: StreamSession | None = None
        self.started = 0.0

    def go(self) -> Reply | StreamSession:
        """Images, upstream with failover, the answer translated back; every exit settles."""
        gw, parsed, call = self.gw, self.parsed, self.call
        try:
            gw.fetch_images(parsed.image_slots, parsed.model, call.auth.org_id)
            if gw.cache_scopes is not None and needs_scope(parsed.body, parsed.model.min_cache_tokens):
                scope_cache(parsed.body, gw.cache_scopes(call.auth.org_id))
            body = encode_body(parsed.body)
            ids = ReplyIds(call.request_id, int(gw.clock()))
            if parsed.stream:
                upstream, first = gw.open_stream(call, parsed.path, body, headers=parsed.headers, source=parsed.body)
                self.deployment = upstream.deployment
                self.started = time.monotonic()
                gw.metrics.streams_open.inc()
                try:
                    session = StreamSession(
                        upstream=upstream,
                        first=first,
                        translator=self.dialect.translator(parsed, ids),
                        owner=self,
                        ping=self.dialect.ping,
                        keepalive_s=gw.keepalive_s,
                        max_tokens=call.max_tokens,
                        trace=call.record.trace,
                    )
                    gw.open_streams.add(session)
                    self.session = session
                    call.record.streaming(time.monotonic())  # its log line is written by ``closed``
                    return session
                except BaseException:
                    upstream.close()
                    gw.metrics.streams_open.dec()
                    raise
            data, _ = gw.complete(
                call, parsed.path, body, stream_flag=parsed.stream_flag, headers=parsed.headers, source=parsed.body
            )
            if call.record.trace is not None:
                call.record.trace.reply(data)
            answer = self.dialect.reply(parsed, data, ids)
        except UpstreamError as exc:
            err = self.failure(exc)
            self.settle(None, self.dialect.status_of(err))
            raise err from None
        except GatewayError as err:
            self.settle(None, self.dialect.status_of(err))
            raise
        except BaseException:
            self.settle(None, 500)
            raise
        self.keep(answer.kept)
        # A client that left while the upstream worked is recorded as having left (it pays for
        # what was produced, as a stream's does), not as a 200 nobody received.
        self.settle(answer.usage, STATUS_OK if self.connected() else CLIENT_CLOSED, rider=answer.record)
        return Reply(answer.body)

    def settle(self, usage: Usage | None, status: int, *, estimated: bool = False, rider: Rider | None = None) -> None:
        self.gw.settle(self.call, usage, status, estimated=estimated, rider=rider)

    def keep(self, kept: KeptThinking | None) -> None:
        """The reply's thinking, kept for the client's next round of the tool loop (the stash
        never fails a request: its errors are logged)."""
        if kept is not None:
            self.gw.thinking.put(self.call.auth.org_id, kept[0], kept[1], self.gw.clock())

    # ------------------------------------------------------------ the stream's owner

    def failure(self, exc: UpstreamError) -> GatewayError:
        return self.dialect.client_error(exc, self.parsed, timeout_s=self.gw.timeout_s, streaming=self.parsed.stream)

    def succeeded(self, usage: Usage, kept: KeptThinking | None, rider: Rider | None = None) -> None:
        gw = self.gw
        self.keep(kept)
        if self.deployment is not None:
            gw.cooldowns.success(health_key(self.call.model, self.deployment))
            gw.metrics.child(gw.metrics.upstream_latency, self.call.model.id, self.deployment.name, "true").observe(
                time.monotonic() - self.started
            )
        self.settle(usage, STATUS_OK, rider=rider)

    def failed(self, failure: GatewayError) -> None:
        """A stream broke after it started: the deployment failed, the request costs nothing."""
        if self.deployment is not None:
            self.gw.cooldowns.failure(health_key(self.call.model, self.deployment), self.gw.clock(), None)
        self.call.record.error = type(failure).__name__
        self.settle(None, self.dialect.status_of(failure))

    def left(self, usage: Usage) -> None:
        """The client went away: bill what was produced, estimated."""
        self.settle(usage, CLIENT_CLOSED, estimated=True)

    def closed(self) -> None:
        self.gw.metrics.streams_open.dec()
        session, self.session = self.session, None  # the session holds its owner: no cycle left behind
        if session is not None:
            self.gw.open_streams.discard(session)
        self.call.record.finish()  # the stream's request log line and request metrics
