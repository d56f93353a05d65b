"""Anthropic Messages, native: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Same keys, permissions, limits, routing, failover, affinity and billing as the OpenAI
endpoint; bodies pass through unchanged except the model name (the deployment's
``upstream_model``) and what the deployment's API version refuses (``translate/versions.py``),
events one by one; Anthropic's error envelope and statuses (529 kept),
and the upstream's own error answers passed on as they came.

The reply names the model as the client sent it (the message's ``model``, in JSON and in
``message_start``), as the OpenAI side does: a client keys its history by that name, and
Claude Code drops the thinking blocks of a reply whose model is not the one it asked for (its
signatures belong to another model), so with an alias its next tool-loop request lacked them
and the upstream refused it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from ezat_compat.dialects import (
    MESSAGES_PATH,
    NOT_JSON,
    Answer,
    EventTranslator,
    Headers,
    KeptThinking,
    Parsed,
    ReplyIds,
    Resolve,
    event_data,
    invalid_request,
)
from ezat_compat.dialects.native_threads import (
    THREADS_BETA,
    ReplyAssembler,
    ThreadTurn,
    not_found,
    thread_of,
    too_long,
    turn_messages,
    unsupported,
    whole_request,
)
from ezat_compat.domain import Usage
from ezat_compat.errors import (
    GatewayError,
    InvalidRequestError,
    UpstreamError,
    anthropic_status,
    render_anthropic,
)
from ezat_compat.failures import client_error
from ezat_compat.jsonfast import encode_json
from ezat_compat.store.hotpath import Rider
from ezat_compat.store.quota import ThreadQuotaError
from ezat_compat.store.threads import LongThreadError, ThreadStore
from ezat_compat.translate.media import decode_base64, is_pdf, sniff_image_type
from ezat_compat.translate.request import ImageSlot
from ezat_compat.translate.response import merge_usage, usage_from_anthropic
from ezat_compat.translate.tables import IMAGE_MEDIA_TYPES
from ezat_compat.upstream.providers.betas import takes_url_sources
from ezat_compat.wire.anthropic import load_messages_request
from ezat_compat.wire.loading import RequestValidationError

log = logging.getLogger(__name__)
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
# Message threads (beta ``message-threads-2026-08-12``, sent by the SDKs' thread helpers and tool
# runners) are held by the gateway (``native_threads``, ``store/threads.py``): neither ``thread``
# nor the beta ever goes upstream; a continuation goes as the whole request it stands for.
# What may be forwarded of them: visible ASCII with spaces or tabs inside. Only SP and HTAB are
# whitespace around a field value (RFC 9110, 5.5 and 5.6.3), never the others Python's ``\s``
# and ``str.strip()`` know (U+0085, U+00A0…), and both fields' values are ASCII tokens.
FORWARDED_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


def forwarded_headers(headers: Headers) -> dict[str, str]:
    """The ``anthropic-version`` and ``anthropic-beta`` fields the client sent, without the SP
    and HTAB around them; ``InvalidRequestError`` naming the field when a value holds anything
    else than visible ASCII (``requests`` would refuse some of it, and no version or beta name is
    anything else). The betas go upstream; the version is the client's only: each deployment
    is sent its own configured one, and the request is shaped for it (``translate/versions.py``),
    so a 2026-10-21 client is served by a 2023-06-01 deployment and the reverse."""
    out: dict[str, str] = {}
    for name in FORWARDED_HEADERS:
        value = (headers.get(name) or "").strip(" \t")
        if not value:
            continue
        if not FORWARDED_VALUE.fullmatch(value):
            bad = next((c for c in value if not (" " <= c <= "~" or c == "\t")), value[0])
            raise InvalidRequestError(
                f"{name}: the header's value must be visible ASCII characters (found U+{ord(bad):04X})", param=name
            )
        out[name] = value
    beta = out.get("anthropic-beta")
    if beta is not None and THREADS_BETA in beta:
        kept = ",".join(b.strip() for b in beta.split(",") if b.strip() and b.strip() != THREADS_BETA)
        if kept:
            out["anthropic-beta"] = kept
        else:
            del out["anthropic-beta"]
    return out


def output_limit_message(max_tokens: int, limit: int, model_name: str) -> str:
    """The real API's 400 for a ``max_tokens`` above the model's output limit, naming the model
    as the client sent it. Source (the API's envelope and words, quoted from
    api.anthropic.com): https://github.com/continuedev/continue/issues/4225 — "max_tokens: 8192
    > 4096, which is the maximum allowed number of output tokens for claude-3-haiku-20240307"."""
    return f"max_tokens: {max_tokens} > {limit}, which is the maximum allowed number of output tokens for {model_name}"


class EventMeter:
    """Passes a native stream through event by event, reading on the way what billing needs:
    usage, produced characters, the end and an error event."""

    __slots__ = ("_produced", "assembler", "done", "error", "keep", "model", "usage")

    def __init__(
        self, model: str | None = None, keep: Callable[[Mapping[str, Any]], Rider | None] | None = None
    ) -> None:
        """``keep``: the stream is a thread's turn; its reply, assembled from the events, is kept
        by ``keep`` once the stream has ended (``record``)."""
        self.model = model  # the model name as the client sent it, put in ``message_start``
        self.usage = Usage()
        self._produced = 0
        self.done = False
        self.error: Mapping[str, Any] | None = None
        self.keep = keep
        self.assembler = ReplyAssembler() if keep is not None else None

    def feed(self, event: str, data: str) -> bytes:
        if self.assembler is not None and event != "ping":
            self.assembler.feed(event, event_data(data))
        if event == "content_block_delta":
            delta = event_data(data).get("delta") or {}
            for key in ("text", "partial_json", "thinking"):
                value = delta.get(key)
                if isinstance(value, str):
                    self._produced += len(value)
        elif event == "message_start":
            start = event_data(data)
            message = start.get("message")
            if isinstance(message, dict):
                self.usage = usage_from_anthropic(message.get("usage"))
                if self.model is not None and message.get("model") != self.model:
                    message["model"] = self.model
                    return b"event: message_start\ndata: " + encode_json(start) + b"\n\n"
        elif event == "message_delta":
            self.usage = merge_usage(self.usage, event_data(data).get("usage"))
        elif event == "message_stop":
            self.done = True
        elif event == "error":
            error = event_data(data).get("error")
            self.error = error if isinstance(error, dict) else {}
        return b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"

    def produced_chars(self) -> int:
        return self._produced

    def end(self) -> bytes:
        return b""

    def kept(self) -> KeptThinking | None:
        return None  # native clients carry their own thinking blocks

    def record(self) -> Rider | None:
        """A thread's turn to keep, once its stream has ended whole (the reply or none of it)."""
        if self.keep is None or self.assembler is None or not self.done or self.error is not None:
            return None
        return self.keep(self.assembler.reply())

    def fail(self, err: GatewayError) -> bytes:
        """An ``error`` event, unless the upstream's own was already passed on."""
        if self.error is not None:
            return b""
        return b"event: error\ndata: " + encode_json(render_anthropic(err)[1]) + b"\n\n"


def _sourced_blocks(messages: Any) -> Iterator[tuple[dict[str, Any], tuple[int, int, int | None]]]:
    """(block, where) of every content block with a ``source``, in the messages and in their
    tool_results; ``where`` is (message, block, tool_result block or None), made into a path only
    for a block that is refused or kept: a long conversation has thousands of blocks, nearly all
    without a source, and this runs on every native request."""
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                continue
            if "source" in block:
                yield block, (i, j, None)
            elif block.get("type") == "tool_result" and isinstance(inner := block.get("content"), list):
                for k, nested in enumerate(inner):
                    if isinstance(nested, dict) and "source" in nested:
                        yield nested, (i, j, k)


def _path(where: tuple[int, int, int | None]) -> str:
    i, j, k = where
    return f"messages.{i}.content.{j}" if k is None else f"messages.{i}.content.{j}.tool_result.content.{k}"


def native_media(messages: Any, *, inline_urls: bool = False) -> list[ImageSlot]:
    """The base64 images of a native request as image slots (the image step decodes each and
    fits those over the upstream's limits; one that doesn't decode is a 400 naming it), after
    the checks the API makes on their bytes, in its words: an image whose bytes are another type
    than its ``media_type`` says, a PDF document that isn't one. A source the API refuses for its
    shape (bad base64, an unknown media type) is left for the upstream to refuse in its words.
    ``inline_urls``: a deployment of the model takes no URL sources (``takes_url_sources``), so
    image and PDF ``url`` sources become slots too: the gateway downloads them (every guard of
    image URLs) and sends their bytes as base64."""
    slots: list[ImageSlot] = []
    for block, where in _sourced_blocks(messages):
        source = block["source"]
        if inline_urls and isinstance(source, dict) and source.get("type") == "url":
            url, kind = source.get("url"), block.get("type")
            if isinstance(url, str) and kind in ("image", "document"):
                path = f"{_path(where)}.{'image' if kind == 'image' else 'pdf'}.source.url"
                slots.append(ImageSlot(path=path, block=block, url=url, pdf=kind == "document"))
            continue
        if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str):
            continue
        kind, declared = block.get("type"), source.get("media_type")
        if kind == "image" and isinstance(declared, str) and declared in IMAGE_MEDIA_TYPES:
            raw = decode_base64(source["data"])
            if raw is None:
                continue
            found = sniff_image_type(raw[:16])
            path = f"{_path(where)}.image.source.base64"
            if found is not None and found != declared:
                raise InvalidRequestError(
                    f"{path}: The image was specified using the {declared} media type, "
                    f"but the image appears to be a {found} image",
                    param=path,
                )
            if found is None:
                raise InvalidRequestError(f"{path}: Could not process image", param=path)
            slots.append(ImageSlot(path=path, block=block, raw=raw))
        elif kind == "document" and declared == "application/pdf":
            raw = decode_base64(source["data"])
            if raw is not None and not is_pdf(raw):
                path = f"{_path(where)}.pdf.source.base64.data"
                raise InvalidRequestError(f"{path}: The PDF specified was not valid.", param=path)
    return slots


def _inline_urls(model: Any) -> bool:
    """A deployment of ``model`` takes no URL sources: the gateway downloads them."""
    return not all(takes_url_sources(d.provider) for d in model.deployments)


def _not_kept(message_id: str, exc: BaseException) -> None:
    log.error("could not keep the thread turn %s", message_id, exc_info=exc)


class AnthropicMessages:
    """``POST /v1/messages``, JSON or ``"stream": true``."""

    endpoint = "messages"
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    path = MESSAGES_PATH
    billed = True

    def __init__(self, threads: ThreadStore | None = None, clock: Callable[[], float] = time.time) -> None:
        """``threads``: where message threads are kept (None: the gateway keeps none; a create
        goes upstream as the whole request it is, a continue is refused)."""
        self.threads = threads if self.billed else None
        self.clock = clock

    def parse(self, body: Any, headers: Headers, resolve: Resolve) -> Parsed:
        """The schema (``wire/anthropic.py``) refuses what the gateway can't do without; the
        body itself goes upstream. A ``max_tokens`` above the model's ``max_output_tokens`` is
        refused here, before any upstream call, as the real API refuses it (400,
        ``output_limit_message``); any other value the upstream would refuse (not an integer,
        below 1) goes to it, and the reservation is the model's maximum."""
        try:
            name = load_messages_request(body)["model"]
        except RequestValidationError as exc:
            raise invalid_request(exc) from None
        forwarded = forwarded_headers(headers)
        model = resolve(name)
        stream = self.billed and body.get("stream") is True
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            max_tokens = model.max_output_tokens  # the upstream refuses it in its own words
        elif max_tokens > model.max_output_tokens and self.billed:
            raise InvalidRequestError(
                output_limit_message(max_tokens, model.max_output_tokens, name), param="max_tokens"
            )
        # with_model puts "model" (and, for streams, "stream") back in front; every other field,
        # an explicit "stream": false included, goes upstream as the client sent it; ``thread``
        # never does (the gateway holds threads).
        turn = thread_of(body)
        if turn is not None and self.threads is None:
            if turn.previous_id is not None:
                raise unsupported()
            turn = None  # a create is a whole request: it goes, and nothing is kept
        if turn is not None:
            turn.auto_cache = (headers.get("x-ezat-cache") or "").strip(" \t").lower() != "off"
        upstream = {k: v for k, v in body.items() if k != "model" and not (stream and k == "stream") and k != "thread"}
        parsed = Parsed(
            model=model,
            model_name=name,
            body=upstream,
            stream=stream,
            max_tokens=max_tokens,
            session=headers.get("x-ezat-session"),
            path=self.path,
            stream_flag=None,
            headers=forwarded,
            billed=self.billed,
            image_slots=native_media(body.get("messages"), inline_urls=_inline_urls(model)),
            context=turn,
        )
        if turn is not None:
            parsed.prepare = self._thread
        return parsed

    def _thread(self, parsed: Parsed, org_id: int) -> None:
        """With the organisation known (before admission; nothing of it needed): a turn of an
        organisation at its storage quota is refused (``thread_unsupported_request`` naming the
        quota); a continue becomes the whole request it stands for (the thread's ``system``,
        ``tools`` and history before its messages), routed in the thread's session; a thread this
        organisation doesn't hold is ``thread_not_found``, one too long to read back
        ``thread_unsupported_request``."""
        turn: ThreadTurn = parsed.context
        turn.org_id = org_id
        if self.threads is None:
            return
        over = self.threads.over_quota(org_id, self.clock())
        if over is not None:
            raise ThreadQuotaError(over)
        if turn.previous_id is None:
            return
        try:
            stored = self.threads.get(org_id, turn.previous_id, self.clock())
        except LongThreadError as exc:
            raise too_long(exc.limit) from None
        if stored is None:
            raise not_found(turn.previous_id)
        turn.root_id = stored.root_id
        caching = parsed.model.caching and turn.auto_cache
        parsed.body = whole_request(parsed.body, stored.fields, stored.messages, caching=caching)
        parsed.session = parsed.session or stored.root_id
        parsed.image_slots = native_media(parsed.body["messages"], inline_urls=_inline_urls(parsed.model))

    def _keep(self, turn: ThreadTurn, reply: Mapping[str, Any]) -> Rider | None:
        """A thread's turn to keep with the request's ledger row: its messages and ``reply``. A
        refused reply is not kept (the SDKs start a new thread after one), nor one without an id."""
        message_id = reply.get("id")
        if self.threads is None or not isinstance(message_id, str) or reply.get("stop_reason") == "refusal":
            return None
        return self.threads.put(
            turn.org_id,
            message_id,
            previous_id=turn.previous_id,
            root_id=turn.root_id or message_id,
            fields=turn.fields,
            messages=turn_messages(turn, reply),
            now=self.clock(),
            failed=partial(_not_kept, message_id),
        )

    def restore_thinking(self, parsed: Parsed, found: Mapping[str, list[dict[str, Any]]]) -> None:
        """Never asked: native clients carry their own thinking blocks (``thinking_ids`` stays empty)."""

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        """The upstream's bytes as they came, but for ``model``: the name as sent; the usage
        read for billing."""
        try:
            message = json.loads(data)
        except ValueError:
            raise GatewayError(NOT_JSON) from None
        if not isinstance(message, dict):
            return Answer(data, usage_from_anthropic(None))
        if "model" in message and message["model"] != parsed.model_name:
            message["model"] = parsed.model_name
            data = encode_json(message)
        turn = parsed.context
        record = self._keep(turn, message) if isinstance(turn, ThreadTurn) else None
        return Answer(data, usage_from_anthropic(message.get("usage")), record=record)

    def translator(self, parsed: Parsed, ids: ReplyIds) -> EventTranslator:
        turn = parsed.context
        return EventMeter(parsed.model_name, partial(self._keep, turn) if isinstance(turn, ThreadTurn) else None)

    def client_error(
        self, exc: UpstreamError, parsed: Parsed | None, *, timeout_s: float, streaming: bool
    ) -> GatewayError:
        return client_error(exc, timeout_s=timeout_s, streaming=streaming)

    def status_of(self, err: GatewayError) -> int:
        return anthropic_status(err)

    def render_error(self, err: GatewayError, request_id: str | None) -> tuple[int, bytes, dict[str, str]]:
        status, body, headers = render_anthropic(err, request_id)
        return status, encode_json(body), headers

    def body_path(self, parts: Sequence[str | int]) -> str:
        """``messages.0.content.1.text``, Anthropic's form."""
        return ".".join(str(part) for part in parts)


class AnthropicCountTokens(AnthropicMessages):
    """``POST /v1/messages/count_tokens``: routed with failover like messages, never billed."""

    endpoint = "count_tokens"
    path = COUNT_TOKENS_PATH
    billed = False

    def reply(self, parsed: Parsed, data: bytes, ids: ReplyIds) -> Answer:
        return Answer(data, None)
