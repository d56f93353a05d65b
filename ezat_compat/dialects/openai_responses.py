"""OpenAI Responses (docs/responses.md): ``POST /openai/v1/responses`` on the same pipeline as
chat completions. Validated by ``wire/responses.py``; translated by
``translate/responses_request.py``, ``translate/responses_response.py`` and
``translate/responses_stream.py``; errors in OpenAI's envelope with the spec's status table.

What needs the organisation runs in ``Parsed.prepare`` (after authentication, before
admission): a request that would be stored is refused if its organisation is at its storage
quota (``store/quota.py``), the stored conversation of ``previous_response_id`` is loaded (its
chain, bounded: ``store/responses.py``), item references are resolved against the stored
responses (``translate/item_references.py``), sealed reasoning is opened, then the request is
translated. It needs nothing of admission, so the key's limits may be checked before it. A
response created with ``store`` is saved once it is complete, with its request's ledger row
(``Answer.record``, ``ResponsesStream.record``: on SQLite in the row's transaction), so before a
stream's last event: its own input (the items as sent, references resolved), its response, and
the id of the response it continued, never the conversation before it again.

``input_items`` lists a stored response's input a page at a time, from the store's index of it
(``ResponseStore.input_page``): the route reads one page, whatever the input's length.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ezat_compat.cooperative import tools
from ezat_compat.dialects import (
    Answer,
    EventTranslator,
    Headers,
    Parsed,
    ReplyIds,
    Resolve,
    TranslatingStream,
    model_then_body,
    openai_error_response,
    upstream_message,
)
from ezat_compat.domain import Model, ResponsesSettings
from ezat_compat.errors import GatewayError, InvalidRequestError, NotFoundError, UpstreamError, render_openai
from ezat_compat.failures import client_error
from ezat_compat.jsonfast import encode_json
from ezat_compat.sealing import Sealer, SealError
from ezat_compat.store.hotpath import Rider
from ezat_compat.store.quota import QuotaRefusal, StorageQuotaError
from ezat_compat.store.responses import BrokenChainError, LongChainError, ResponseStore
from ezat_compat.translate.item_references import (
    RESPONSE_PREFIX,
    item_key,
    referenced_responses,
    references,
    resolve_references,
)
from ezat_compat.translate.responses_items import listed_input_item
from ezat_compat.translate.responses_request import ResponsesTranslation, input_items, responses_to_anthropic
from ezat_compat.translate.responses_response import ItemIds, anthropic_to_response, client_view, response_skeleton
from ezat_compat.translate.responses_stream import Event, ResponseEvents
from ezat_compat.translate.thinking import (
    ThinkingCollector,
    assistant_tool_ids,
    restore_thinking,
    thinking_of_reply,
    without_thinking,
)
from ezat_compat.translate.upstream_errors import rewrite_upstream_message
from ezat_compat.wire.paths import format_path
from ezat_compat.wire.responses import MODEL_NAME_MAX, load_responses_request

log = logging.getLogger("ezat_compat")

STORE_OFF = "stored responses are switched off on this gateway; send the whole conversation in input"
SEALED_BAD = (
    "the encrypted reasoning can't be opened: it was changed, or comes from another organisation; "
    "send the reasoning item as this gateway returned it, or leave it out"
)


LIST_LIMIT_MAX = 100  # input_items: ``limit`` 1-100 (the API reference's "List input items")
LIST_LIMIT_DEFAULT = 20


def not_found(response_id: str, param: str | None = None) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param=param)


def broken_chain(response_id: str) -> NotFoundError:
    """A continue of a response whose conversation lost an earlier response (deleted, expired)."""
    return NotFoundError(
        f"Response with id '{response_id}' can't be continued: an earlier response of its conversation "
        "was deleted or has expired; send the whole conversation in input.",
        param="previous_response_id",
    )


def long_chain(limit: int) -> InvalidRequestError:
    """A continue of a conversation over the gateway's bound (``ResponseStore.max_chain_bytes``)."""
    return InvalidRequestError(
        f"previous_response_id: the stored conversation is over {limit / (1024 * 1024):g} MB, more than the "
        "gateway reads back for a continue; start a new conversation with what it still needs in input.",
        param="previous_response_id",
    )


_HEADS: dict[str, bytes] = {}  # "event: <type>\ndata: " by event type (the few dozen this dialect sends)


def _head(kind: str) -> bytes:
    head = _HEADS.get(kind)
    if head is None:
        head = _HEADS[kind] = f"event: {kind}\ndata: ".encode()
    return head


def encode_event(event: Event) -> bytes:
    """``event: <type>`` and ``data: {json}``, one SSE event (a lone surrogate escaped). Only an
    event carrying the response object can hold a float (the request's settings and tools it
    echoes); the others are made of text and counts."""
    kind, payload = event
    return _head(kind) + encode_json(payload, floats="response" in payload) + b"\n\n"


_OPENINGS: dict[str, bytes] = {}  # the event's head and its data up to the response's JSON, by type


def _opening(kind: str) -> bytes:
    opening = _OPENINGS.get(kind)
    if opening is None:
        opening = _OPENINGS[kind] = _head(kind) + b'{"type":' + encode_json(kind, floats=False) + b',"response":'
    return opening


@dataclass(slots=True)
class Context:
    """The Responses dialect's part of a parsed request."""

    req: dict[str, Any]  # the body as the client sent it: the response echoes it
    loaded: dict[str, Any]  # what the schema loaded: what is translated
    model: Model
    headers: Headers
    store: bool  # this response is saved
    items: list[tuple[dict[str, Any], str]]  # this request's input, as sent (stored so)
    org_id: int = 0
    previous_id: str | None = None  # the stored response this one continues
    translation: ResponsesTranslation | None = None


class ResponsesServices:
    """What the dialect needs beyond the pipeline: the store, the sealer, the settings, a clock,
    and the storage quota (``quota``: the limit an organisation has reached, or None; the
    store's ``over_quota``; None: no quota)."""

    def __init__(
        self,
        settings: ResponsesSettings,
        store: ResponseStore | None,
        sealer: Sealer,
        clock: Callable[[], float],
        quota: Callable[[int, float], QuotaRefusal | None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store if settings.store else None
        self.sealer = sealer
        self.clock = clock
        self.quota = quota if self.store is not None else None

    def record(self, ctx: Context, response: dict[str, Any], response_json: bytes | None = None) -> Rider | None:
        """A finished response to keep, as a write riding with the request's ledger row (put
        at once when the store has no hot path). A failure is logged: the client has its answer."""
        store = self.store
        if store is None or not ctx.store:  # ctx.store: asked for, and the store is on
            return None
        translation = ctx.translation
        encrypted = bool(translation and translation.encrypted)
        failed = partial(_not_stored, response.get("id"))
        now = self.clock()
        try:
            return store.put(
                ctx.org_id,
                response,
                [item for item, _ in ctx.items],
                0,
                encrypted,
                now,
                response_json=response_json,
                failed=failed,
                previous_id=ctx.previous_id,
                pause=tools().pause,
            )
        except Exception as exc:
            failed(exc)
            return None


def _not_stored(response_id: Any, exc: BaseException) -> None:
    log.error("could not store response %s", response_id, exc_info=exc)


class EventWriter:
    """Encodes a stream's events. The response object, which three or four events carry whole
    (``response.created`` and ``.in_progress`` one object, the last event and the stored
    response another), is written once per object: an event of exactly ``type``, ``response``
    and ``sequence_number`` (as ``ResponseEvents`` builds them, in that order) is put together
    around the response's JSON, the bytes ``encode_json`` would give for the whole event."""

    __slots__ = ("_json", "_of")

    def __init__(self) -> None:
        self._of: object = None
        self._json = b""

    def json_of(self, response: Mapping[str, Any]) -> bytes:
        if response is not self._of:
            self._of, self._json = response, encode_json(response)
        return self._json

    def encode(self, event: Event) -> bytes:
        kind, payload = event
        response = payload.get("response") if len(payload) == 3 else None
        if response is None:
            return encode_event(event)
        return b"".join(
            (
                _opening(kind),
                self.json_of(response),
                b',"sequence_number":',
                str(payload["sequence_number"]).encode(),
                b"}\n\n",
            )
        )


class ResponsesStream(TranslatingStream[ResponseEvents]):
    """Anthropic events -> Responses SSE events (``translate.responses_stream`` translates;
    this encodes, seals, keeps the thinking and stores the finished response)."""

    __slots__ = ("_final", "ctx", "services", "writer")

    def __init__(
        self, events: ResponseEvents, thinking: ThinkingCollector | None, services: ResponsesServices, ctx: Context
    ) -> None:
        super().__init__(events, thinking)
        self.services = services
        self.ctx = ctx
        self.writer = EventWriter()
        self._final: dict[str, Any] | None = None

    def feed(self, event: str, data: str) -> bytes:
        produced = self.translate(event, data)
        encode = self.writer.encode
        if len(produced) == 1:
            return encode(produced[0])
        return b"".join([encode(e) for e in produced])

    def produced_chars(self) -> int:
        return self.source.produced_chars

    def _final_response(self) -> dict[str, Any]:
        if self._final is None:
            self._final = self.source.final_response()
        return self._final

    def record(self) -> Rider | None:
        """The finished response, stored with the request's ledger row (before the last event)."""
        response = self._final_response()
        if not self.ctx.store:
            return None  # (nor its JSON written for nothing)
        return self.services.record(self.ctx, response, self.writer.json_of(response))

    def end(self) -> bytes:
        """After the usage (and the stored response) are recorded: the final event."""
        return self.writer.encode(self.source.final_event(self._final_response()))

    def fail(self, err: GatewayError) -> bytes:
        """``error`` then ``response.failed``; nothing is stored."""
        error = render_openai(err)[1]["error"]
        return b"".join(self.writer.encode(e) for e in self.source.failed_events(error))


class OpenAIResponses:
    """``POST /openai/v1/responses``."""

    endpoint = "responses"
    ping = b": ping\n\n"

    def __init__(self, services: ResponsesServices) -> None:
        self.services = services

    # ------------------------------------------------------------ parse

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        """The model first (404 / 403), then the schema (``wire/responses.py``), then (in
        ``prepare``, with the organisation known) the conversation and the translation."""
        model, loaded = model_then_body(body, resolve, load_responses_request, MODEL_NAME_MAX)
        if loaded.get("previous_response_id") is not None and self.services.store is None:
            raise InvalidRequestError(f"previous_response_id: {STORE_OFF}", param="previous_response_id")
        store = loaded.get("store") is not False and self.services.store is not None
        ctx = Context(req=body, loaded=loaded, model=model, headers=headers, store=store, items=input_items(body))
        parsed = Parsed(
            model=model,
            model_name=loaded["model"],
            body={},
            stream=loaded.get("stream") is True,
            max_tokens=0,
            context=ctx,
        )
        parsed.prepare = self._prepare
        return parsed

    def _prepare(self, parsed: Parsed, org_id: int) -> None:
        """The organisation's part: its quota (a response to store, refused at the quota before
        anything is read), the conversation continued, the items referenced; then the
        translation. Needs nothing of admission."""
        ctx: Context = parsed.context
        ctx.org_id = org_id
        store, quota = self.services.store, self.services.quota
        if ctx.store and quota is not None:
            over = quota(org_id, self.services.clock())
            if over is not None:
                raise StorageQuotaError(over)
        earlier: list[tuple[dict[str, Any], str]] = []
        previous = ctx.loaded.get("previous_response_id")
        if isinstance(previous, str) and store is not None:
            try:
                stored = store.get(org_id, previous, self.services.clock())
            except BrokenChainError:
                raise broken_chain(previous) from None
            except LongChainError as exc:
                raise long_chain(exc.limit) from None
            if stored is None:
                raise not_found(previous, "previous_response_id")
            earlier = [(item, "previous_response_id") for item in stored.continuation()]
            ctx.previous_id = previous
        items = input_items(ctx.loaded)
        refs = references(items)
        if refs:  # (only then: a request without references reads nothing more)
            outputs = self._referenced(org_id, refs, ctx.loaded.get("store") is not False)
            items, ctx.items = outputs(items), outputs(ctx.items)
        auto_cache = (ctx.headers.get("x-ezat-cache") or "").strip(" \t").lower() != "off"
        translation = responses_to_anthropic(
            ctx.loaded,
            earlier + items,
            ctx.model,
            unseal=partial(self._unseal, org_id),
            auto_cache=auto_cache,
            pause=tools().pause,
        )
        ctx.translation = translation
        parsed.body = translation.body
        parsed.max_tokens = translation.body["max_tokens"]
        parsed.session = ctx.headers.get("x-ezat-session") or translation.session
        parsed.image_slots = translation.image_slots
        if translation.thinking:
            parsed.thinking_ids = [t for ids in assistant_tool_ids(translation.body) for t in ids]

    def _referenced(
        self, org_id: int, refs: list[tuple[str, str]], store: bool
    ) -> Callable[[Sequence[tuple[dict[str, Any], str]]], list[tuple[dict[str, Any], str]]]:
        """The stored output items the references name (one read for all of them), as a
        function replacing each reference of a list of items by its item; an id the
        organisation has no live response for answers 404 naming ``input[N].id``."""
        if self.services.store is None:
            path = refs[0][1]
            raise InvalidRequestError(f"{path}.id: {STORE_OFF}", param=f"{path}.id")
        wanted = referenced_responses(refs, store)
        outputs = self.services.store.outputs(org_id, wanted, self.services.clock())
        return partial(resolve_references, outputs=outputs, store=store)

    def _unseal(self, org_id: int, sealed: Any, path: str) -> list[dict[str, Any]]:
        """The sealed blocks; none when no key of the gateway's ring sealed them (a rotated key,
        another node's): the turn goes on without that thinking, as kept thinking that expired
        does (``restore_thinking``); a changed or foreign item answers 400 naming ``path``."""
        try:
            blocks = self.services.sealer.unseal(org_id, sealed)
        except SealError:
            raise InvalidRequestError(f"{path}: {SEALED_BAD}", param=path) from None
        if blocks is None:
            log.info("sealed reasoning at %s was sealed under a key this gateway no longer holds: dropped", path)
            return []
        return blocks

    # ------------------------------------------------------------ stored responses

    def input_items(self, org_id: int, response_id: str, args: Mapping[str, str]) -> dict[str, Any]:
        """``GET …/responses/{id}/input_items`` for the organisation: its input, newest first
        unless ``order=asc``; ``limit`` (1-100, 20) and ``after`` / ``before`` (an item id) page
        through it. One page is read (``ResponseStore.input_page``); 404 when the organisation
        has no such live response."""
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order: must be asc or desc", param="order")
        try:
            limit = int(args.get("limit", str(LIST_LIMIT_DEFAULT)))
        except ValueError:
            raise InvalidRequestError("limit: must be an integer", param="limit") from None
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidRequestError(f"limit: must be between 1 and {LIST_LIMIT_MAX}", param="limit")
        store = self.services.store
        with tools().own_turn():  # a page of a huge input: another stream's keep-alive between two
            page = (
                store.input_page(
                    org_id,
                    response_id,
                    self.services.clock(),
                    descending=order == "desc",
                    limit=limit,
                    after=args.get("after"),
                    before=args.get("before"),
                )
                if store is not None
                else None
            )
        if page is None:
            raise not_found(response_id)
        data = [listed_input_item(item, response_id, n) for n, item in page.items]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": page.has_more,
        }

    def restore_thinking(self, parsed: Parsed, found: Mapping[str, list[dict[str, Any]]]) -> None:
        """Kept thinking back at the start of the assistant tool turns; without it for the last
        one, the request goes without thinking (as for chat)."""
        translation: ResponsesTranslation = parsed.context.translation
        if not restore_thinking(parsed.body, found, translation.source_map):
            without_thinking(parsed.body, translation.sampling, parsed.model)
            translation.thinking = False

    # ------------------------------------------------------------ answers

    def _seal(self, ctx: Context) -> Callable[[list[dict[str, Any]]], str] | None:
        translation = ctx.translation
        if translation is None or not translation.thinking or not (translation.encrypted or ctx.store):
            return None
        return partial(self.services.sealer.seal, ctx.org_id)

    def _skeleton(self, parsed: Parsed, ids: ReplyIds) -> dict[str, Any]:
        ctx: Context = parsed.context
        return response_skeleton(
            ctx.req,
            response_id=RESPONSE_PREFIX + ids.request_id,
            created=ids.created,
            model=parsed.model_name,
            store=ctx.store,
        )

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        message = upstream_message(data)
        ctx: Context = parsed.context
        translation = ctx.translation
        assert translation is not None
        response, usage = anthropic_to_response(
            message,
            self._skeleton(parsed, ids),
            ids=ItemIds(item_key(ids.request_id)),
            tools=translation.tools,
            summary=translation.summary,
            seal=self._seal(ctx),
        )
        content = message.get("content")
        kept = thinking_of_reply(content) if translation.thinking and isinstance(content, list) else None
        view = client_view(response, translation.encrypted)
        body = encode_json(view)
        record = self.services.record(ctx, response, body if view is response else None)
        return Answer(body, usage, kept, record)

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator:
        ctx: Context = parsed.context
        translation = ctx.translation
        assert translation is not None
        events = ResponseEvents(
            self._skeleton(parsed, ids),
            ids=ItemIds(item_key(ids.request_id)),
            tools=translation.tools,
            summary=translation.summary,
            seal=self._seal(ctx),
            include_encrypted=translation.encrypted,
        )
        return ResponsesStream(events, ThinkingCollector() if translation.thinking else None, self.services, ctx)

    # ------------------------------------------------------------ errors

    def client_error(
        self, exc: UpstreamError, parsed: Parsed | None, *, timeout_s: float, streaming: bool
    ) -> GatewayError:
        translation = parsed.context.translation if parsed is not None and parsed.context else None
        source_map = translation.source_map if translation is not None else {}
        err = client_error(
            exc,
            rewrite=partial(rewrite_upstream_message, source_map=source_map),
            timeout_s=timeout_s,
            streaming=streaming,
        )
        err.upstream = None
        return err

    def status_of(self, err: GatewayError) -> int:
        return err.status

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
        return openai_error_response(err)

    def body_path(self, parts: Sequence[str | int]) -> str:
        """``messages[0].content[2].text``, the spec's form."""
        return format_path(parts)
